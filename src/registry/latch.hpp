// A one-shot event with asynchronous, cancellable waiters and no lost
// wake-ups: set() and wait() serialise on one mutex, and a waiter that
// arrives after set() completes at once (posted, never inline).
#pragma once

#include <corma/backend.hpp>
#include <corma/detail/completion.hpp>
#include <corma/error.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace corma::detail {

class Latch : public std::enable_shared_from_this<Latch> {
 public:
  using WaitHandler = asio::any_completion_handler<void(Result<void>)>;

  /// `backend`: whose progress thread answers a waiter that has no
  /// executor of its own while it lives (a latch outlives its region).
  explicit Latch(std::weak_ptr<RdmaBackend> backend) : backend_(std::move(backend)) {}

  [[nodiscard]] bool is_set() const;

  /// Idempotent; completes every waiter with success.
  void set();

  /// Completes with success once set, or with `cancelled` if the caller's
  /// cancellation slot fires first.
  void wait(WaitHandler handler);

 private:
  void cancel(std::uint64_t ticket);
  /// Where an answer given inside wait() or a cancellation is posted from
  /// (Completion::post).
  [[nodiscard]] asio::any_io_executor early_executor() const;

  const std::weak_ptr<RdmaBackend> backend_;

  mutable std::mutex mutex_;
  bool set_ = false;
  std::uint64_t next_ticket_ = 0;
  std::map<std::uint64_t, Completion<void(Result<void>)>> waiters_;
};

}  // namespace corma::detail
