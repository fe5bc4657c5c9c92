// corma serve --announce-files: every regular file under the root announced
// in the directory by its name, with its modification time in nanoseconds
// as its version, so that consumers rank replicas newest first and can ask
// for one version. The tree is scanned again every few seconds, off the
// event loop, and announced anew (under the same lease, only what changed)
// whenever the scan differs from what was announced.
#pragma once

#include <corma/directory.hpp>
#include <corma/error.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace corma::cli {

/// Each file's name (relative to the root, '/'-separated) and version.
using FileVersions = std::map<std::string, std::uint64_t, std::less<>>;

/// The most files one owner announces by name: past it, announce prefixes.
inline constexpr std::size_t max_announced_files = 100000;

/// The regular files under `root` (symbolic links not followed), each with
/// its modification time in nanoseconds; names a consumer could not ask for
/// (check_object_name) are left out. `out_of_range` past `most` files, the
/// error of the first directory that cannot be read otherwise.
[[nodiscard]] Result<FileVersions> scan_files(const std::filesystem::path& root, std::size_t most);

class FileAnnouncer {
 public:
  /// What each announcement did: its result and the files it named.
  using Told = std::function<void(const Result<void>& announced, std::size_t files)>;

  /// Announces `base` (the owner, its ttl and prefixes) with the files
  /// under `root` as its names, scanned on `scanner` every `every`.
  FileAnnouncer(boost::asio::any_io_executor executor, boost::asio::any_io_executor scanner, Directory& directory,
                Announcement base, std::filesystem::path root, std::chrono::milliseconds every);

  void start(Told told);
  /// Nothing is announced after this (withdraw next).
  void stop();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace corma::cli
