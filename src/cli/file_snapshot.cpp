#include "file_snapshot.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace corma::cli {
namespace {

std::int64_t nanoseconds(const struct timespec& t) noexcept {
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

/// How often a file that changes while it is read is read again before
/// the fetch is refused.
constexpr int read_attempts = 3;

}  // namespace

FileVersion FileVersion::of(const struct stat& info) noexcept {
  return {info.st_dev, info.st_ino, info.st_size, nanoseconds(info.st_mtim), nanoseconds(info.st_ctim)};
}

FileSnapshot::FileSnapshot(FileVersion version, std::size_t size,
                           std::shared_ptr<std::atomic<std::uint64_t>> accounted)
    : version_(version),
      size_(size),
      data_(std::make_unique_for_overwrite<std::byte[]>(size)),
      accounted_(std::move(accounted)) {
  accounted_->fetch_add(size_);
}

FileSnapshot::~FileSnapshot() { accounted_->fetch_sub(size_); }

SnapshotCache::SnapshotCache(std::uint64_t max_bytes)
    : max_bytes_(max_bytes), held_(std::make_shared<std::atomic<std::uint64_t>>(0)) {}

Result<std::shared_ptr<const FileSnapshot>> SnapshotCache::snapshot(int fd, const std::string& key,
                                                                     std::string_view name) {
  for (int attempt = 0; attempt < read_attempts; ++attempt) {
    struct stat info {};
    if (::fstat(fd, &info) != 0) return fail(errc::region_not_found, "cannot stat '" + std::string(name) + "'");
    const auto version = FileVersion::of(info);
    {
      std::lock_guard lock(mutex_);
      if (auto cached = cache_.find(key); cached != cache_.end()) {
        if (cached->second.snapshot->version() == version) {
          cached->second.last_used = ++uses_;
          return cached->second.snapshot;
        }
        cache_.erase(cached);  // an older version: its readers keep their own reference
      }
      make_room(static_cast<std::uint64_t>(version.size));
    }
    auto fresh = read_whole(fd, version, name);
    if (!fresh && !fresh.error().is(errc::object_changed)) return fresh;
    if (fresh) {
      std::lock_guard lock(mutex_);
      cache_[key] = Cached{fresh.value(), ++uses_};
      return fresh;
    }
  }
  return fail(errc::object_changed, "'" + std::string(name) + "' kept changing while it was read");
}

void SnapshotCache::make_room(std::uint64_t size) {
  while (held_->load() + size > max_bytes_) {
    auto oldest_idle = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->second.snapshot.use_count() != 1) continue;  // someone reads it
      if (oldest_idle == cache_.end() || it->second.last_used < oldest_idle->second.last_used) oldest_idle = it;
    }
    if (oldest_idle == cache_.end()) return;
    cache_.erase(oldest_idle);
  }
}

Result<std::shared_ptr<const FileSnapshot>> SnapshotCache::read_whole(int fd, FileVersion version,
                                                                       std::string_view name) {
  const auto size = static_cast<std::uint64_t>(version.size);
  if (held_->load() + size > max_bytes_) {
    return fail(errc::budget_exceeded, "serving '" + std::string(name) + "' (" + std::to_string(size) +
                                           " bytes) would take file snapshots past their limit of " +
                                           std::to_string(max_bytes_) + " bytes");
  }
  auto snapshot = std::make_shared<FileSnapshot>(version, size, held_);
  auto out = snapshot->bytes();
  for (std::uint64_t at = 0; at < size;) {
    const auto got = ::pread(fd, out.data() + at, size - at, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return fail(errc::backend, "reading '" + std::string(name) + "': " + std::strerror(errno));
    }
    if (got == 0) return fail(errc::object_changed, "'" + std::string(name) + "' shrank while it was read");
    at += static_cast<std::uint64_t>(got);
  }
  // The bytes are one version only if nothing changed the file meanwhile.
  struct stat after {};
  if (::fstat(fd, &after) != 0 || !(FileVersion::of(after) == version)) {
    return fail(errc::object_changed, "'" + std::string(name) + "' changed while it was read");
  }
  return std::shared_ptr<const FileSnapshot>(std::move(snapshot));
}

}  // namespace corma::cli
