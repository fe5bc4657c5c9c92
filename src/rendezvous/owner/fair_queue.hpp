// The owner's costly work (acquires: file look-ups, registrations) from
// many connections, taken in turns by what it costs rather than in the
// order it arrived, so that no connection's backlog stands in front of
// another's request.
//
// Start-time fair queueing over connections: each connection counts the
// units of work (names) it has had done; the connection with the smallest
// count goes next. One that had nothing queued starts one go ahead of the
// connection served last, so a newcomer's request is taken next (the
// sparse-flow priority of FQ-CoDel), while neither a flood nor a long idle
// spell moves it ahead of the others by more than that one go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace corma::rendezvous {

/// Work done a few units at a time.
class Job {
 public:
  virtual ~Job() = default;
  /// Does at least one and at most `budget` units; how many it did.
  virtual std::size_t run(std::size_t budget) = 0;
  /// Nothing is left to run (parts may still be under way elsewhere).
  [[nodiscard]] virtual bool finished() const = 0;
  /// Its connection is gone: it will not run again, and must end without
  /// doing what is left.
  virtual void abandon() = 0;
};

class FairQueue {
 public:
  void push(std::uint64_t connection, std::shared_ptr<Job> job);

  /// A connection's job runs at most this many units before the next
  /// connection in line has its go.
  static constexpr std::size_t units_per_go = 4;

  /// Runs jobs worth at most `budget` units, fairest first, each connection
  /// at most `units_per_go` at a go; the units done.
  std::size_t run(std::size_t budget);

  /// Abandons every job of `connection`: those queued, and those that ran
  /// to their end with parts still under way (a look-up, a registration).
  void drop(std::uint64_t connection);

  /// Jobs queued for `connection` that have not run to their end.
  [[nodiscard]] std::size_t queued(std::uint64_t connection) const;
  /// Called with the connection whenever one of its jobs has run to its end.
  std::function<void(std::uint64_t)> on_job_done;

  [[nodiscard]] bool empty() const noexcept { return ready_.empty(); }
  /// Connections with jobs queued.
  [[nodiscard]] std::size_t ready() const noexcept { return ready_.size(); }

 private:
  struct Queue {
    std::deque<std::shared_ptr<Job>> jobs;
    std::uint64_t served = 0;  ///< units done for this connection, on the shared clock
  };

  /// Jobs of a connection that ran to their end, known while they live
  /// (parts under way hold them), so that drop() reaches them too.
  struct Ran {
    std::vector<std::weak_ptr<Job>> jobs;
    std::size_t after_sweep = 0;  ///< swept of jobs gone when it has doubled since
  };
  void remember_ran(std::uint64_t connection, const std::shared_ptr<Job>& job);

  std::unordered_map<std::uint64_t, Queue> queues_;
  std::unordered_map<std::uint64_t, Ran> ran_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> ready_;  ///< (served, connection) with jobs queued
  std::uint64_t clock_ = 0;  ///< `served` of the connection run last
};

}  // namespace corma::rendezvous
