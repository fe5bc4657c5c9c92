// The owner's costly work (acquires, windows) from every connection, run a
// turn at a time by one coroutine: the jobs wait in the fair queue
// (fair_queue.hpp), a connection's reader is held back while it has enough
// queued, and the dispatcher sleeps while there is nothing to do. Used on
// the owner's executor alone.
#pragma once

#include "rendezvous/owner/fair_queue.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

namespace corma::rendezvous {

class WorkDispatcher {
 public:
  /// A connection reads its next frame only while it has fewer than this
  /// many jobs queued: the rest of a flood waits unread, in its socket, so
  /// that an event-loop turn reads a frame from the connections whose work
  /// moved on rather than from every connection, and a newcomer's frame is
  /// read within a short turn.
  static constexpr std::size_t max_jobs_queued = 2;
  /// A turn runs jobs until this much time has passed (and at least one
  /// go), then lets the connections' reads and writes run.
  static constexpr std::chrono::microseconds max_work_turn{2000};

  explicit WorkDispatcher(boost::asio::any_io_executor executor);
  WorkDispatcher(const WorkDispatcher&) = delete;
  WorkDispatcher& operator=(const WorkDispatcher&) = delete;

  /// Queues `job` for `connection` and wakes the dispatcher.
  void push(std::uint64_t connection, std::shared_ptr<Job> job);
  /// Abandons every job of `connection` (its connection is gone).
  void drop(std::uint64_t connection) { queue_.drop(connection); }

  /// Returns once `connection` has fewer than max_jobs_queued jobs queued.
  boost::asio::awaitable<void> until_taken(std::uint64_t connection);

  /// Runs the queued jobs a turn at a time, `before_turn()` first in each
  /// turn, until `stopping()` holds and nothing is queued.
  boost::asio::awaitable<void> run(std::function<bool()> stopping, std::function<void()> before_turn);
  /// Wakes a run() waiting for work, to look at `stopping()` again.
  void wake();

 private:
  boost::asio::any_io_executor executor_;
  FairQueue queue_;
  /// Woken (cancelled) when work arrives while run() waits for it.
  boost::asio::steady_timer work_arrived_;
  bool waiting_ = false;
  /// Readers waiting for their connection's queue to shrink, woken
  /// (cancelled) when one of its jobs ends.
  std::unordered_map<std::uint64_t, boost::asio::steady_timer*> readers_waiting_;
};

}  // namespace corma::rendezvous
