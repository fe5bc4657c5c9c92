// Serves the files under one directory, read-only, by relative path. Nothing
// that resolves outside the directory (.., absolute paths, symlinks) is ever
// opened.
#pragma once

#include <corma/owner.hpp>

#include <filesystem>

namespace corma::cli {

class FileResolver {
 public:
  /// Fails when `root` is not a directory.
  static Result<FileResolver> create(const std::filesystem::path& root);

  /// Maps the file read-only. `region_not_found` for a missing file;
  /// `not_owned` for anything that leads outside the root.
  Result<PublishedObject> operator()(std::string_view name) const;

  [[nodiscard]] const std::filesystem::path& root() const noexcept { return root_; }

 private:
  explicit FileResolver(std::filesystem::path root) : root_(std::move(root)) {}
  std::filesystem::path root_;  // canonical
};

}  // namespace corma::cli
