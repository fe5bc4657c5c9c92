#include "snapshot_budget.hpp"

#include <algorithm>
#include <string>

namespace corma::cli {

Result<void> SnapshotBudget::take(std::uint64_t size, const std::function<void(std::uint64_t)>& make_room,
                                  const std::atomic<bool>& stop, std::chrono::milliseconds patience) {
  if (size > limit_) {
    return fail(errc::budget_exceeded, "a snapshot of " + std::to_string(size) + " bytes is more than their limit of " +
                                           std::to_string(limit_) + " bytes");
  }
  const auto deadline = std::chrono::steady_clock::now() + patience;
  std::unique_lock lock(mutex_);
  const std::uint64_t ticket = next_ticket_++;
  line_.push_back(ticket);
  ++changes_;
  changed_.notify_all();  // for wait_until_waiting(); those in line look again, harmlessly
  for (;;) {
    const bool first = line_.front() == ticket;
    if (first && held_ + size <= limit_) {
      held_ += size;
      leave(ticket);
      return success();
    }
    if (stop.load(std::memory_order_acquire)) {
      leave(ticket);
      return fail(errc::cancelled, "nobody wants the snapshot any more");
    }
    std::uint64_t seen = changes_;
    if (first) {
      // Idle kept snapshots go first; their bytes come back through
      // give_back(), which takes this lock: let it go meanwhile.
      lock.unlock();
      make_room(size);
      lock.lock();
      if (held_ + size <= limit_ || changes_ != seen) continue;
      seen = changes_;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      leave(ticket);
      return fail(errc::budget_exceeded, "no room for a snapshot of " + std::to_string(size) + " bytes within " +
                                             std::to_string(patience.count()) + " ms: the other snapshots, " +
                                             std::to_string(held_) + " bytes, are all being read (limit " +
                                             std::to_string(limit_) + " bytes)");
    }
    changed_.wait_until(lock, deadline, [&] { return changes_ != seen; });
  }
}

void SnapshotBudget::leave(std::uint64_t ticket) {
  line_.erase(std::find(line_.begin(), line_.end(), ticket));
  ++changes_;
  changed_.notify_all();
}

void SnapshotBudget::give_back(std::uint64_t size) {
  std::lock_guard lock(mutex_);
  held_ -= size;
  ++changes_;
  changed_.notify_all();
}

void SnapshotBudget::nudge() {
  std::lock_guard lock(mutex_);
  if (line_.empty()) return;
  ++changes_;
  changed_.notify_all();
}

std::uint64_t SnapshotBudget::held() const {
  std::lock_guard lock(mutex_);
  return held_;
}

bool SnapshotBudget::wait_until_waiting(std::size_t count, std::chrono::milliseconds limit) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, limit, [&] { return line_.size() == count; });
}

std::size_t SnapshotBudget::waiting() const {
  std::lock_guard lock(mutex_);
  return line_.size();
}

}  // namespace corma::cli
