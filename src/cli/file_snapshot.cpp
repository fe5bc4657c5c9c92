#include "file_snapshot.hpp"

#include "snapshot_budget.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace corma::cli {

FileSnapshot::FileSnapshot(std::size_t size, std::shared_ptr<SnapshotBudget> budget)
    : size_(size), budget_(std::move(budget)) {
  try {
    data_ = std::make_unique_for_overwrite<std::byte[]>(size);
  } catch (...) {
    budget_->give_back(size_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

FileSnapshot::~FileSnapshot() { budget_->give_back(size_); }

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
