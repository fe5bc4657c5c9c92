// The byte budget: reservations taken atomically before a map, committed
// when the region is recorded, released only on confirmed unmap.
#pragma once

#include <corma/error.hpp>

#include <atomic>
#include <cstdint>
#include <memory>

namespace corma::detail {

class Budget : public std::enable_shared_from_this<Budget> {
 public:
  /// Bytes held for one registration in progress; given back on destruction
  /// unless committed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();
    /// The bytes now belong to a live region; release_committed() returns them.
    void commit() noexcept;
    [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }

   private:
    friend class Budget;
    Reservation(std::shared_ptr<Budget> budget, std::uint64_t bytes) noexcept
        : budget_(std::move(budget)), bytes_(bytes) {}
    std::shared_ptr<Budget> budget_;
    std::uint64_t bytes_ = 0;
  };

  explicit Budget(std::uint64_t limit) : limit_(limit) {}

  /// Reserves `bytes` unless that would exceed the limit; never overshoots
  /// under concurrency. Fails with budget_exceeded and the figures.
  [[nodiscard]] Result<Reservation> reserve(std::uint64_t bytes);
  void release_committed(std::uint64_t bytes) noexcept;

  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::uint64_t committed() const noexcept { return committed_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t reserved() const noexcept { return reserved_.load(std::memory_order_relaxed); }

 private:
  const std::uint64_t limit_;
  std::atomic<std::uint64_t> charged_{0};  // reserved + committed: what admission checks
  std::atomic<std::uint64_t> reserved_{0};
  std::atomic<std::uint64_t> committed_{0};
};

}  // namespace corma::detail
