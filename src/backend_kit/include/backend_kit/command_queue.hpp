// Commands for a progress thread. Callers push from any thread; the progress
// thread takes everything queued at once between provider progress calls.
// Cheaper than posting each command to the thread's io_context: no scheduler
// lock per command and, above all, no epoll_wait on every turn of a spinning
// loop (io_context::poll() runs the reactor). A progress thread asleep in its
// io_context is woken by a post there, only when it said it was going to sleep.
// Commands pushed by the progress thread itself (coroutines running on its
// executor) skip the lock: they run on its next turn, in order.
#pragma once

#include <corma/detail/unique_function.hpp>

#include <boost/asio/io_context.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

namespace corma::backend_kit {

class CommandQueue {
 public:
  using Command = detail::UniqueFunction;

  explicit CommandQueue(boost::asio::io_context& io) : io_(io) {}

  /// Any thread.
  void push(Command command);

  /// Progress thread: runs every command queued so far; returns how many.
  std::size_t run_all();
  /// Progress thread, before sleeping in the io_context: false (do not
  /// sleep) when commands are already waiting. Otherwise the next push wakes it.
  bool prepare_to_sleep();
  /// Progress thread: awake again (or decided not to sleep after all).
  void awake() noexcept { sleeping_.store(false, std::memory_order_seq_cst); }

 private:
  std::size_t run(std::vector<Command>& commands);

  boost::asio::io_context& io_;
  std::mutex mutex_;
  std::vector<Command> pending_;
  std::vector<Command> running_;  // only the progress thread touches it
  std::vector<Command> own_;      // pushed by the progress thread: no lock
  std::vector<Command> own_running_;
  std::atomic<bool> sleeping_{false};
};

}  // namespace corma::backend_kit
