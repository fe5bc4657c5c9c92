#include "guard_share.hpp"

namespace corma::detail {

GuardShare::~GuardShare() {
  // A guard always lets go first; this is the safety net.
  if ((state_.load(std::memory_order_acquire) & returned_bit) == 0) {
    state_.store(returned_bit, std::memory_order_relaxed);
    give_back();
  }
}

bool GuardShare::begin_transfer() noexcept {
  std::uint64_t seen = state_.load(std::memory_order_relaxed);
  do {
    if ((seen & held_bit) == 0) return false;
  } while (!state_.compare_exchange_weak(seen, seen + 1, std::memory_order_acquire, std::memory_order_relaxed));
  return true;
}

void GuardShare::end_transfer() {
  const std::uint64_t now = state_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  if (now == 0 && claim_return(now)) give_back();
}

void GuardShare::let_go() {
  const std::uint64_t before = state_.fetch_and(~held_bit, std::memory_order_acq_rel);
  if ((before & held_bit) == 0) return;
  const std::uint64_t now = before & ~held_bit;
  if (now == 0 && claim_return(now)) give_back();
}

bool GuardShare::claim_return(std::uint64_t seen) noexcept {
  // Sequentially consistent, like event_made_: whichever of give_back() and
  // given_back() comes second sees the other's mark.
  return state_.compare_exchange_strong(seen, returned_bit, std::memory_order_seq_cst);
}

void GuardShare::give_back() {
  // The owner may hand the bytes to a waiter at once.
  owner_->give_back(offset_, len_);
  if (!event_made_.load(std::memory_order_seq_cst)) return;
  std::shared_ptr<Latch> event;
  {
    std::lock_guard lock(event_mutex_);
    event = given_back_;
  }
  event->set();  // outside the lock: a waiter may ask for the event again
}

std::shared_ptr<Latch> GuardShare::given_back() {
  std::shared_ptr<Latch> event;
  {
    std::lock_guard lock(event_mutex_);
    if (!given_back_) {
      given_back_ = std::make_shared<Latch>(owner_->backend());
      event_made_.store(true, std::memory_order_seq_cst);
    }
    event = given_back_;
  }
  // Returned before anyone asked, or while the event was being made.
  if ((state_.load(std::memory_order_seq_cst) & returned_bit) != 0) event->set();
  return event;
}

std::shared_ptr<Latch> GuardShare::memory_released() {
  if (auto released = owner_->memory_released()) return released;
  return given_back();
}

void GuardShare::deregister() {
  owner_->deregistration_asked();
  let_go();
}

}  // namespace corma::detail
