// A served file's bytes, read whole into memory the server owns, as one
// consistent version of the file. The server never maps a served file: a
// file truncated under a mapping kills the reader with SIGBUS, and a file
// rewritten under one hands out a mix of two versions. A snapshot cannot
// change, so every consumer that reads it gets exactly one version.
#pragma once

#include <corma/error.hpp>

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

namespace corma::cli {

/// What tells two versions of a file apart: the inode and everything a
/// write or truncate changes (size, modification and change times, to the
/// nanosecond the file system keeps).
struct FileVersion {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;

  static FileVersion of(const struct stat& info) noexcept;
  friend bool operator==(const FileVersion&, const FileVersion&) = default;
};

class FileSnapshot {
 public:
  FileSnapshot(FileVersion version, std::size_t size, std::shared_ptr<std::atomic<std::uint64_t>> accounted);
  ~FileSnapshot();
  FileSnapshot(const FileSnapshot&) = delete;
  FileSnapshot& operator=(const FileSnapshot&) = delete;

  [[nodiscard]] const FileVersion& version() const noexcept { return version_; }
  [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_.get(), size_}; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_.get(), size_}; }

 private:
  FileVersion version_;
  std::size_t size_;
  std::unique_ptr<std::byte[]> data_;
  std::shared_ptr<std::atomic<std::uint64_t>> accounted_;
};

/// Snapshots shared by everyone who reads the same version of a file (one
/// buffer per version however many leases read it), within a byte limit.
/// A snapshot nobody reads any more stays cached for the next fetch of the
/// same version (which then reads and faults in nothing), until a newer
/// version replaces it or another file needs its room (least recently used
/// first).
class SnapshotCache {
 public:
  explicit SnapshotCache(std::uint64_t max_bytes);

  /// The snapshot of the open file `fd` (known as `name` in messages):
  /// the cached one if the file is still that version, else read anew.
  /// `object_changed` when the file keeps changing while it is read;
  /// `budget_exceeded` when snapshots alive would exceed the limit.
  Result<std::shared_ptr<const FileSnapshot>> snapshot(int fd, const std::string& key, std::string_view name);

  /// Bytes held by snapshots, in use or cached.
  [[nodiscard]] std::uint64_t bytes_held() const noexcept { return held_->load(); }

 private:
  struct Cached {
    std::shared_ptr<const FileSnapshot> snapshot;
    std::uint64_t last_used = 0;
  };

  Result<std::shared_ptr<const FileSnapshot>> read_whole(int fd, FileVersion version, std::string_view name);
  /// Drops cached snapshots nobody reads, least recently used first, until
  /// `size` more bytes fit the limit or none is left to drop (under mutex_).
  void make_room(std::uint64_t size);

  std::uint64_t max_bytes_;
  std::shared_ptr<std::atomic<std::uint64_t>> held_;
  std::mutex mutex_;
  std::unordered_map<std::string, Cached> cache_;
  std::uint64_t uses_ = 0;  // the clock of last_used
};

}  // namespace corma::cli
