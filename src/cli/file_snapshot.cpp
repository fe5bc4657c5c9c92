#include "file_snapshot.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace corma::cli {

FileSnapshot::FileSnapshot(std::size_t size, std::shared_ptr<std::atomic<std::uint64_t>> accounted)
    : size_(size), data_(std::make_unique_for_overwrite<std::byte[]>(size)), accounted_(std::move(accounted)) {
  accounted_->fetch_add(size_);
}

FileSnapshot::~FileSnapshot() { accounted_->fetch_sub(size_); }

Result<void> read_into(int fd, std::span<std::byte> out, std::string_view name, const std::atomic<bool>* stop) {
  for (std::size_t at = 0; at < out.size();) {
    if (stop != nullptr && stop->load(std::memory_order_acquire)) {
      return fail(errc::cancelled, "nobody wants '" + std::string(name) + "' any more");
    }
    const auto got = ::pread(fd, out.data() + at, std::min(out.size() - at, read_chunk), static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return fail(errc::backend, "reading '" + std::string(name) + "': " + std::strerror(errno));
    if (got == 0) return fail(errc::object_changed, "'" + std::string(name) + "' shrank while it was read");
    at += static_cast<std::size_t>(got);
  }
  return success();
}

}  // namespace corma::cli
