// A backend's notifications on the target side: what peers sent, queued up
// to a bound, and the callers waiting in async_receive_notification. One
// thread uses it at a time (a backend's progress thread, or under its lock).
#pragma once

#include <corma/backend.hpp>
#include <corma/detail/completion.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

namespace corma::detail {

class NotificationInbox {
 public:
  /// One async_receive_notification; `cancelled` is set on the caller's
  /// thread by its cancellation handler, before the inbox hears of it.
  struct Receiver {
    Completion<void(Result<Notification>)> completion;
    std::atomic<bool> cancelled{false};
  };

  explicit NotificationInbox(std::size_t capacity = notification_queue_capacity) : capacity_(capacity) {}

  /// A notification from an accepted peer: handed to the oldest waiting
  /// receiver, or queued; `budget_exceeded` when the queue is full (it is
  /// then not delivered, and the sender is told).
  Result<void> deliver(Notification notification) {
    if (closed_) return *closed_;
    while (!waiting_.empty()) {
      auto receiver = std::move(waiting_.front());
      waiting_.pop_front();
      if (receiver->cancelled.load(std::memory_order_acquire)) {
        // Its cancellation is on its way here; it finds the receiver gone.
        receiver->completion.dispatch(fail(errc::cancelled, "receive cancelled"));
        continue;
      }
      receiver->completion.dispatch(notification);
      return success();
    }
    if (queued_.size() >= capacity_) {
      return fail(errc::budget_exceeded, "the target's notification queue is full");
    }
    queued_.push_back(notification);
    return success();
  }

  /// Answers `receiver` with the oldest queued notification (posted through
  /// `via`: this may run inside its initiation), or keeps it waiting.
  void receive(const std::shared_ptr<Receiver>& receiver, const asio::any_io_executor& via) {
    if (receiver->cancelled.load(std::memory_order_acquire)) {
      return receiver->completion.post(via, fail(errc::cancelled, "receive cancelled before it ran"));
    }
    if (closed_) return receiver->completion.post(via, *closed_);
    if (!queued_.empty()) {
      const auto next = queued_.front();
      queued_.pop_front();
      return receiver->completion.post(via, next);
    }
    waiting_.push_back(receiver);
  }

  /// A waiting receiver was cancelled: answered so, having taken nothing.
  void cancel(const std::shared_ptr<Receiver>& receiver) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (*it == receiver) {
        waiting_.erase(it);
        receiver->completion.dispatch(fail(errc::cancelled, "receive cancelled"));
        return;
      }
    }
  }

  /// Shutdown: every waiting receiver, and every later one, is answered
  /// `error`; what was queued is dropped.
  void close(const Error& error) {
    closed_ = error;
    queued_.clear();
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& receiver : waiting) receiver->completion.dispatch(error);
  }

  [[nodiscard]] std::size_t queued() const noexcept { return queued_.size(); }

 private:
  const std::size_t capacity_;
  std::deque<Notification> queued_;
  std::deque<std::shared_ptr<Receiver>> waiting_;
  std::optional<Error> closed_;
};

}  // namespace corma::detail
