#include "budget.hpp"

#include <utility>

namespace corma::detail {

Budget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::move(other.budget_)), bytes_(std::exchange(other.bytes_, 0)) {}

Budget::Reservation& Budget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Reservation dropped(std::move(*this));
    budget_ = std::move(other.budget_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Budget::Reservation::~Reservation() {
  if (budget_ && bytes_ != 0) {
    budget_->reserved_.fetch_sub(bytes_, std::memory_order_relaxed);
    budget_->charged_.fetch_sub(bytes_, std::memory_order_acq_rel);
  }
}

void Budget::Reservation::commit() noexcept {
  if (!budget_ || bytes_ == 0) return;
  budget_->committed_.fetch_add(bytes_, std::memory_order_relaxed);
  budget_->reserved_.fetch_sub(bytes_, std::memory_order_relaxed);
  bytes_ = 0;
}

Result<Budget::Reservation> Budget::reserve(std::uint64_t bytes) {
  std::uint64_t charged = charged_.load(std::memory_order_acquire);
  do {
    if (bytes > limit_ || charged > limit_ - bytes) {
      return Error{errc::budget_exceeded, "registration does not fit the budget",
                   BudgetFigures{bytes, charged, limit_}};
    }
  } while (!charged_.compare_exchange_weak(charged, charged + bytes, std::memory_order_acq_rel,
                                           std::memory_order_acquire));
  reserved_.fetch_add(bytes, std::memory_order_relaxed);
  return Reservation(shared_from_this(), bytes);
}

void Budget::release_committed(std::uint64_t bytes) noexcept {
  committed_.fetch_sub(bytes, std::memory_order_relaxed);
  charged_.fetch_sub(bytes, std::memory_order_acq_rel);
}

}  // namespace corma::detail
