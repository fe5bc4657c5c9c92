// Commands for a progress thread. Callers push from any thread; the progress
// thread takes everything queued at once between provider progress calls.
// Cheaper than posting each command to the thread's io_context: no scheduler
// lock per command and, above all, no epoll_wait on every turn of a spinning
// loop (io_context::poll() runs the reactor). A progress thread asleep in its
// io_context is woken with a post there, only when it said it would sleep.
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

  /// Any thread. Once the queue is closed the command is dropped (destroyed
  /// on the calling thread), as a handler posted to a destroyed io_context.
  void push(Command command);

  /// Progress thread: runs every command queued so far; returns how many.
  std::size_t run_all();
  /// Progress thread, before sleeping in the io_context: false (do not
  /// sleep) when commands are already waiting. Otherwise the next push wakes it.
  bool prepare_to_sleep();
  /// Progress thread: awake again (or decided not to sleep after all).
  void awake() noexcept { sleeping_.store(false, std::memory_order_seq_cst); }
  /// Progress thread, once its loop has ended: later pushes are dropped.
  void close();

  /// The progress thread's io_context (the progress executor's context).
  [[nodiscard]] boost::asio::io_context& io() const noexcept { return io_; }

  /// Whether the calling thread is the progress thread running this queue.
  [[nodiscard]] bool on_progress_thread() const noexcept { return running_here_ == this; }

  /// Marks the calling thread as the progress thread for the scope's life
  /// (the loop's whole run).
  class ProgressThreadScope {
   public:
    explicit ProgressThreadScope(const CommandQueue& queue) noexcept : outer_(running_here_) { running_here_ = &queue; }
    ~ProgressThreadScope() { running_here_ = outer_; }
    ProgressThreadScope(const ProgressThreadScope&) = delete;
    ProgressThreadScope& operator=(const ProgressThreadScope&) = delete;

   private:
    const CommandQueue* outer_;
  };

 private:
  std::size_t run(std::vector<Command>& commands);

  static inline thread_local const CommandQueue* running_here_ = nullptr;

  boost::asio::io_context& io_;
  std::mutex mutex_;
  std::vector<Command> pending_;
  std::atomic<bool> has_pending_{false};  // set under mutex_ with a push; a hint read without it
  bool closed_ = false;            // guarded by mutex_
  std::vector<Command> running_;   // only the progress thread touches it
  std::vector<Command> own_;       // pushed by the progress thread: no lock
  std::vector<Command> own_running_;
  bool own_closed_ = false;        // the progress thread's view of closed_
  std::atomic<bool> sleeping_{false};
};

}  // namespace corma::backend_kit
