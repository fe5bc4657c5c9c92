// The byte limit of corma serve's file snapshots, shared out in turn. A
// read that finds the limit spent waits in line for room instead of being
// refused at once: room comes back as consumers let go of snapshots, and a
// burst of cold files larger together than the limit is served one after
// another. The line is first come, first served, so a large file is never
// starved by a stream of small ones that each would fit.
#pragma once

#include <corma/error.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

namespace corma::cli {

class SnapshotBudget {
 public:
  explicit SnapshotBudget(std::uint64_t limit) : limit_(limit) {}
  SnapshotBudget(const SnapshotBudget&) = delete;
  SnapshotBudget& operator=(const SnapshotBudget&) = delete;

  /// Takes `size` bytes for a snapshot: at once when they fit and no read
  /// that asked before waits; else in line, once every read before it is
  /// served and the bytes fit. While first in line and short of room, it
  /// calls `make_room(size)` (outside this budget's lock) to let idle kept
  /// snapshots go. `budget_exceeded` at once for more than the whole limit,
  /// or once `patience` passed in line; `cancelled` once `stop` is set
  /// (the read's every look-up gave up; nudge() makes it look).
  Result<void> take(std::uint64_t size, const std::function<void(std::uint64_t)>& make_room,
                    const std::atomic<bool>& stop, std::chrono::milliseconds patience);
  /// Gives back what take() took (a snapshot went).
  void give_back(std::uint64_t size);
  /// Something may have changed for the reads in line (a reader let go of a
  /// kept snapshot, which may now be let go; a read was given up).
  void nudge();

  [[nodiscard]] std::uint64_t held() const;
  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  /// Reads waiting in line for room.
  [[nodiscard]] std::size_t waiting() const;
  /// Waits up to `limit` until exactly `count` reads wait in line; whether
  /// they do (for a caller that must know a read is queued, e.g. a test).
  bool wait_until_waiting(std::size_t count, std::chrono::milliseconds limit) const;

 private:
  /// Leaves the line (under mutex_); whoever is next gets to look.
  void leave(std::uint64_t ticket);

  const std::uint64_t limit_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::uint64_t held_ = 0;
  std::deque<std::uint64_t> line_;  ///< tickets of the reads in line, first come first
  std::uint64_t next_ticket_ = 0;
  /// Counts every change a read in line may wait for: a wait that began
  /// after the last one it saw cannot miss the next.
  std::uint64_t changes_ = 0;
};

}  // namespace corma::cli
