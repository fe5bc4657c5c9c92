#include "latch.hpp"

#include <vector>

namespace corma::detail {

bool Latch::is_set() const {
  std::lock_guard lock(mutex_);
  return set_;
}

void Latch::set() {
  std::map<std::uint64_t, Completion<void(Result<void>)>> woken;
  {
    std::lock_guard lock(mutex_);
    if (set_) return;
    set_ = true;
    woken.swap(waiters_);
  }
  for (auto& [ticket, waiter] : woken) waiter.dispatch(success());
}

void Latch::wait(WaitHandler handler) {
  Completion<void(Result<void>)> waiter(std::move(handler));
  std::unique_lock lock(mutex_);
  if (set_) {
    lock.unlock();
    waiter.post(early_executor(), success());
    return;
  }
  const std::uint64_t ticket = next_ticket_++;
  // A cancelled wait changes nothing: every type is honoured.
  waiter.on_cancellation(any_cancellation, [weak = weak_from_this(), ticket] {
    if (auto self = weak.lock()) self->cancel(ticket);
  });
  waiters_.emplace(ticket, std::move(waiter));
}

void Latch::cancel(std::uint64_t ticket) {
  Completion<void(Result<void>)> waiter;
  {
    std::lock_guard lock(mutex_);
    auto it = waiters_.find(ticket);
    if (it == waiters_.end()) return;
    waiter = std::move(it->second);
    waiters_.erase(it);
  }
  // Posted: we are inside the caller's cancellation handler, which the
  // completion would otherwise clear while it runs.
  waiter.post(early_executor(), fail(errc::cancelled, "wait for deregistration cancelled"));
}

asio::any_io_executor Latch::early_executor() const {
  auto backend = backend_.lock();
  return backend ? backend->progress_executor() : asio::any_io_executor{};
}

}  // namespace corma::detail
