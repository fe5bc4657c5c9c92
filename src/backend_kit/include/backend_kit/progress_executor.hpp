// RdmaBackend::progress_executor() of a provider-backed engine. Work given
// to it runs on the progress thread through the engine's command queue, so
// the loop needs no io_context handler of its own for it:
//   - dispatched (blocking.possibly, what a completion uses) from the
//     progress thread, it runs inline: a transfer completed by a progress
//     turn resumes its coroutine at the end of that turn, with no hand-off;
//   - posted (blocking.never: post, co_spawn, a coroutine's resumption after
//     a post), or dispatched from any other thread, it is queued and runs on
//     the next turn; the queue wakes a sleeping loop.
// Its execution context is the engine's io_context, so timers and sockets
// made from it are served by the same thread. Like an io_context executor it
// must not be used to make new I/O objects once its backend is gone; work
// given to it after the loop ended is dropped.
#pragma once

#include "backend_kit/command_queue.hpp"

#include <boost/asio/execution/blocking.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/io_context.hpp>

#include <memory>
#include <utility>

namespace corma::backend_kit {

class ProgressExecutor {
 public:
  explicit ProgressExecutor(std::shared_ptr<CommandQueue> queue) noexcept : queue_(std::move(queue)) {}

  [[nodiscard]] boost::asio::io_context& query(boost::asio::execution::context_t) const noexcept {
    return queue_->io();
  }

  [[nodiscard]] boost::asio::execution::blocking_t query(boost::asio::execution::blocking_t) const noexcept {
    return never_ ? boost::asio::execution::blocking_t(boost::asio::execution::blocking.never)
                  : boost::asio::execution::blocking_t(boost::asio::execution::blocking.possibly);
  }

  [[nodiscard]] ProgressExecutor require(boost::asio::execution::blocking_t::never_t) const noexcept {
    return with_never(true);
  }
  [[nodiscard]] ProgressExecutor require(boost::asio::execution::blocking_t::possibly_t) const noexcept {
    return with_never(false);
  }

  template <class Function>
  void execute(Function&& f) const {
    if (!never_ && queue_->on_progress_thread()) {
      auto inline_call(std::forward<Function>(f));
      inline_call();
      return;
    }
    queue_->push(CommandQueue::Command(std::forward<Function>(f)));
  }

  friend bool operator==(const ProgressExecutor& a, const ProgressExecutor& b) noexcept {
    return a.queue_ == b.queue_ && a.never_ == b.never_;
  }
  friend bool operator!=(const ProgressExecutor& a, const ProgressExecutor& b) noexcept { return !(a == b); }

 private:
  [[nodiscard]] ProgressExecutor with_never(bool never) const noexcept {
    ProgressExecutor copy = *this;
    copy.never_ = never;
    return copy;
  }

  std::shared_ptr<CommandQueue> queue_;
  bool never_ = false;
};

// Small enough for any_io_executor to keep inline: copying one allocates
// nothing and shares no count between threads.
static_assert(sizeof(ProgressExecutor) <= sizeof(std::shared_ptr<void>) + sizeof(void*));

}  // namespace corma::backend_kit
