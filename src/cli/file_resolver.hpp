// Serves the files under one directory, read-only, by relative path. Nothing
// that resolves outside the directory (.., absolute paths, symlinks) is ever
// opened. A file is served from a snapshot of one version of it
// (file_snapshot.hpp), never from a mapping.
#pragma once

#include <corma/owner.hpp>

#include "file_snapshot.hpp"

#include <filesystem>
#include <memory>

namespace corma::cli {

class FileResolver {
 public:
  /// Snapshots alive at once hold at most this many bytes by default.
  static constexpr std::uint64_t default_snapshot_limit = std::uint64_t{1} << 30;

  /// Fails when `root` is not a directory.
  static Result<FileResolver> create(const std::filesystem::path& root,
                                     std::uint64_t snapshot_limit = default_snapshot_limit);

  /// A snapshot of the file's current version (shared with every lease that
  /// reads the same version). `region_not_found` for a missing file;
  /// `not_owned` for anything that leads outside the root; `object_changed`
  /// for a file that keeps changing while it is read; `budget_exceeded`
  /// past the snapshot limit.
  Result<PublishedObject> operator()(std::string_view name) const;

  /// Bytes held by snapshots, in use or cached for the next fetch.
  [[nodiscard]] std::uint64_t snapshot_bytes() const noexcept { return snapshots_->bytes_held(); }

  [[nodiscard]] const std::filesystem::path& root() const noexcept { return root_; }

 private:
  FileResolver(std::filesystem::path root, std::uint64_t snapshot_limit)
      : root_(std::move(root)), snapshots_(std::make_shared<SnapshotCache>(snapshot_limit)) {}
  std::filesystem::path root_;  // canonical
  std::shared_ptr<SnapshotCache> snapshots_;  // shared by copies of the resolver
};

}  // namespace corma::cli
