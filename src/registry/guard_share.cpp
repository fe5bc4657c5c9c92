#include "guard_share.hpp"

namespace corma::detail {

GuardShare::~GuardShare() {
  // A guard always lets go first; this is the safety net.
  if (!returned_) give_back(given_back_);
}

bool GuardShare::begin_transfer() {
  std::lock_guard lock(mutex_);
  if (!held_) return false;
  ++transfers_;
  return true;
}

void GuardShare::end_transfer() {
  std::shared_ptr<Latch> latch;
  {
    std::lock_guard lock(mutex_);
    if (--transfers_ != 0 || held_ || returned_) return;
    returned_ = true;
    latch = given_back_;
  }
  give_back(latch);
}

void GuardShare::let_go() {
  std::shared_ptr<Latch> latch;
  {
    std::lock_guard lock(mutex_);
    if (!held_) return;
    held_ = false;
    if (transfers_ != 0) return;
    returned_ = true;
    latch = given_back_;
  }
  give_back(latch);
}

void GuardShare::give_back(const std::shared_ptr<Latch>& latch) {
  // Outside the lock: the owner may hand the bytes to a waiter at once.
  owner_->give_back(offset_, len_);
  if (latch) latch->set();
}

std::shared_ptr<Latch> GuardShare::given_back() {
  std::lock_guard lock(mutex_);
  if (!given_back_) {
    given_back_ = std::make_shared<Latch>(backend_);
    if (returned_) given_back_->set();  // nobody waits on it yet
  }
  return given_back_;
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
