#include "arena_core.hpp"

#include "region_state.hpp"

#include <algorithm>
#include <bit>
#include <string>
#include <utility>

namespace corma::detail {
namespace {

bool power_of_two(std::size_t n) { return n != 0 && std::has_single_bit(n); }

}  // namespace

Result<std::uint64_t> ArenaCore::capacity_for(std::size_t bytes, const ArenaConfig& config) {
  if (!power_of_two(config.min_slice) || !power_of_two(config.max_slice) || config.min_slice > config.max_slice) {
    return fail(errc::out_of_range, "arena slice sizes must be powers of two with min_slice <= max_slice");
  }
  if (bytes == 0) return fail(errc::out_of_range, "an arena of 0 bytes");
  constexpr std::uint64_t largest = std::uint64_t{1} << 40;  // keeps the rounding below from overflowing
  if (bytes > largest) return fail(errc::out_of_range, "an arena of more than 1 TiB");
  const std::uint64_t chunks = (static_cast<std::uint64_t>(bytes) + config.max_slice - 1) / config.max_slice;
  return chunks * config.max_slice;
}

ArenaCore::ArenaCore(RegionGuard whole, ArenaConfig config)
    : whole_(std::move(whole)),
      counters_(whole_.state_->counters()),
      config_(config),
      capacity_(whole_.size() / config.max_slice * config.max_slice),
      backend_(whole_.state_->backend()),
      free_(static_cast<std::size_t>(std::countr_zero(config.max_slice) - std::countr_zero(config.min_slice)) + 1) {
  stats_.capacity_bytes = capacity_;
  RegistryCounters::bump(counters_.arenas);
  counters_.arena_capacity_bytes.fetch_add(capacity_, std::memory_order_relaxed);
  counters_.add_arena(this);
}

ArenaCore::~ArenaCore() {
  // Every slice is back: slices hold the core.
  counters_.remove_arena(this);
  counters_.arenas.fetch_sub(1, std::memory_order_relaxed);
  counters_.arena_capacity_bytes.fetch_sub(capacity_, std::memory_order_relaxed);
}

Result<std::size_t> ArenaCore::class_of(std::size_t bytes) const {
  if (bytes == 0) return fail(errc::out_of_range, "a slice of 0 bytes");
  if (bytes > config_.max_slice) {
    return fail(errc::out_of_range,
                "a slice of " + std::to_string(bytes) + " bytes; the arena's largest is " +
                    std::to_string(config_.max_slice));
  }
  const std::size_t rounded = std::max(std::bit_ceil(bytes), config_.min_slice);
  return static_cast<std::size_t>(std::countr_zero(rounded) - std::countr_zero(config_.min_slice));
}

std::optional<std::uint64_t> ArenaCore::take_locked(std::size_t cls) {
  auto& slices = free_[cls];
  if (slices.empty()) {
    if (carved_ + config_.max_slice > capacity_) return std::nullopt;
    // A fresh chunk, cut into this class's slices (last first, so the
    // lowest address is handed out first).
    const std::uint64_t size = config_.min_slice << cls;
    for (std::uint64_t offset = carved_ + config_.max_slice; offset > carved_;) {
      offset -= size;
      slices.push_back(offset);
    }
    carved_ += config_.max_slice;
  }
  const std::uint64_t offset = slices.back();
  slices.pop_back();
  ++stats_.slices;
  ++stats_.allocations;
  stats_.allocated_bytes += config_.min_slice << cls;
  return offset;
}

void ArenaCore::put_back_locked(std::size_t cls, std::uint64_t offset) {
  free_[cls].push_back(offset);
  const std::uint64_t size = config_.min_slice << cls;
  --stats_.slices;
  stats_.allocated_bytes -= size;
}

RegionGuard ArenaCore::slice_at(std::uint64_t offset, std::size_t bytes) {
  return RegionGuard(whole_.state_, std::make_shared<GuardShare>(shared_from_this(), offset, bytes));
}

Result<RegionGuard> ArenaCore::allocate(std::size_t bytes) {
  CORMA_TRY(auto cls, class_of(bytes));
  std::optional<std::uint64_t> offset;
  {
    std::lock_guard lock(mutex_);
    offset = take_locked(cls);
    if (!offset) ++stats_.refused;
  }
  if (!offset) {
    return fail(errc::budget_exceeded, "the arena has no free slice of " + std::to_string(config_.min_slice << cls) +
                                           " bytes (" + std::to_string(capacity_) + " bytes in all)");
  }
  return slice_at(*offset, bytes);
}

void ArenaCore::allocate_or_wait(std::size_t bytes, AllocateHandler handler) {
  Completion<void(Result<RegionGuard>)> completion(std::move(handler));
  auto cls = class_of(bytes);
  if (!cls) return completion.post(early_executor(), std::move(cls).error());
  std::unique_lock lock(mutex_);
  if (closed_) {
    lock.unlock();
    return completion.post(early_executor(), fail(errc::shutting_down, "the arena is closed"));
  }
  const auto offset = take_locked(cls.value());
  if (offset) {
    lock.unlock();
    return completion.post(early_executor(), slice_at(*offset, bytes));
  }
  const std::uint64_t ticket = next_ticket_++;
  completion.on_cancellation(any_cancellation, [weak = weak_from_this(), ticket] {
    if (auto self = weak.lock()) self->cancel(ticket);
  });
  waiters_.emplace(ticket, Waiter{bytes, std::move(completion)});
  stats_.waiting = waiters_.size();
}

void ArenaCore::cancel(std::uint64_t ticket) {
  Completion<void(Result<RegionGuard>)> completion;
  {
    std::lock_guard lock(mutex_);
    auto it = waiters_.find(ticket);
    if (it == waiters_.end()) return;
    completion = std::move(it->second.completion);
    waiters_.erase(it);
    stats_.waiting = waiters_.size();
  }
  // Posted: we are inside the caller's cancellation handler.
  completion.post(early_executor(), fail(errc::cancelled, "waiting for an arena slice cancelled"));
}

void ArenaCore::give_back(std::uint64_t offset, std::uint64_t len) noexcept {
  const std::size_t cls = class_of(static_cast<std::size_t>(len)).value();
  std::vector<std::pair<Completion<void(Result<RegionGuard>)>, RegionGuard>> served;
  {
    std::lock_guard lock(mutex_);
    put_back_locked(cls, offset);
    // Waiters in arrival order, each served if its class has room now.
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      auto wanted = class_of(it->second.bytes).value();
      auto taken = take_locked(wanted);
      if (!taken) {
        ++it;
        continue;
      }
      try {
        served.emplace_back(std::move(it->second.completion), slice_at(*taken, it->second.bytes));
      } catch (...) {
        // Out of memory making the slice: it goes back and the waiter waits on.
        put_back_locked(wanted, *taken);
        break;
      }
      it = waiters_.erase(it);
    }
    stats_.waiting = waiters_.size();
  }
  // Outside the lock: a waiter's handler may give its slice back at once.
  for (auto& [completion, slice] : served) completion.dispatch(std::move(slice));
}

void ArenaCore::close() {
  std::map<std::uint64_t, Waiter> waiters;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    waiters.swap(waiters_);
    stats_.waiting = 0;
  }
  for (auto& [ticket, waiter] : waiters) {
    waiter.completion.dispatch(fail(errc::shutting_down, "the arena was closed"));
  }
}

ArenaStats ArenaCore::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

asio::any_io_executor ArenaCore::early_executor() const {
  auto backend = backend_.lock();
  return backend ? backend->progress_executor() : asio::any_io_executor{};
}

}  // namespace corma::detail
