#include "registry_core.hpp"

#include <unistd.h>

#include <boost/asio/bind_cancellation_slot.hpp>

#include <algorithm>
#include <string>
#include <utility>

namespace corma::detail {
namespace {

std::size_t system_page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

std::unique_ptr<RegistrationCache> make_cache(const RegistryConfig& config) {
  const double share = std::clamp(config.cache_idle_share, 0.0, 1.0);
  return std::make_unique<RegistrationCache>(
      static_cast<std::uint64_t>(share * static_cast<double>(config.budget_bytes)), config.share_exposed_registrations);
}

/// Runs `then` once every latch in `latches` is set (or its wait ended).
void after_all(const std::vector<std::shared_ptr<Latch>>& latches, UniqueFunction then) {
  auto left = std::make_shared<std::atomic<std::size_t>>(latches.size());
  auto shared_then = std::make_shared<UniqueFunction>(std::move(then));
  for (const auto& latch : latches) {
    latch->wait([left, shared_then](Result<void>) {
      if (left->fetch_sub(1, std::memory_order_acq_rel) == 1) (*shared_then)();
    });
  }
}

}  // namespace

struct RegistryCore::Registration {
  Completion<void(Result<RegionGuard>, OwnedBuffer)> completion;
  std::span<std::byte> memory;  ///< what is registered
  Access access = Access::local;
  Budget::Reservation reservation;
  OwnedBuffer owned;
  std::chrono::steady_clock::time_point started;
  /// Set when the registration goes into the cache: the bytes the caller
  /// asked for, inside `memory`.
  std::optional<std::span<std::byte>> cached;
  RegistrationOptions options;
};

RegistryCore::RegistryCore(std::shared_ptr<RdmaBackend> backend, RegistryConfig config)
    : backend_(std::move(backend)),
      page_size_(config.page_size != 0 ? config.page_size : system_page_size()),
      budget_(std::make_shared<Budget>(config.budget_bytes)),
      cache_by_default_(config.cache_registrations),
      cache_(make_cache(config)) {}

std::uint64_t RegistryCore::charge_for(const void* ptr, std::size_t len) const noexcept {
  if (len == 0) return 0;
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uint64_t first_page = start / page_size_;
  const std::uint64_t last_page = (start + (len - 1)) / page_size_;
  return (last_page - first_page + 1) * page_size_;
}

void RegistryCore::start_registration(std::span<std::byte> memory, Access access, RegistrationOptions options,
                                      OwnedBuffer owned, RegistrationDone done) {
  const bool cached = !owned && (options.caching == Caching::keep ||
                                 (options.caching == Caching::registry_default && cache_by_default_));
  Registration reg{Completion<void(Result<RegionGuard>, OwnedBuffer)>(std::move(done)),
                   memory,
                   access,
                   {},
                   std::move(owned),
                   std::chrono::steady_clock::now(),
                   std::nullopt,
                   std::move(options)};
  auto refuse = [&](Error error) {
    counters_.record_failure(error);
    reg.completion.post(backend_->progress_executor(), std::move(error), std::move(reg.owned));
  };

  if (auto valid = validate_range(memory.data(), memory.size()); !valid) {
    return refuse(std::move(valid).error());
  }
  bool admitted = false;
  {
    std::lock_guard lock(mutex_);
    admitted = !closed_;
    if (admitted) ++admitted_;
  }
  if (!admitted) return refuse(Error{errc::shutting_down, "registry is shutting down"});
  if (cached) {
    if (auto shared = cache_->share(memory, access, true)) {
      reg.completion.post(backend_->progress_executor(), std::move(*shared), OwnedBuffer{});
      return admitted_done();
    }
    reg.cached = memory;
    // A local registration covers its whole pages, so that later ones
    // inside them share it; one exposed to peers covers exactly its bytes.
    if (access == Access::local) {
      const auto start = reinterpret_cast<std::uintptr_t>(memory.data());
      const auto first = start / page_size_ * page_size_;
      reg.memory = std::span<std::byte>(reinterpret_cast<std::byte*>(first),
                                        static_cast<std::size_t>(charge_for(memory.data(), memory.size())));
    }
  }
  reserve_and_map(std::move(reg), true);
}

Result<RegionGuard> RegistryCore::find_cached(std::span<std::byte> memory, Access access) {
  CORMA_TRY(validate_range(memory.data(), memory.size()));
  // Shutdown closes the cache before the registry: a closed one shares
  // nothing, so the registry's lock is needed only to name a miss.
  if (auto shared = cache_->share(memory, access, false)) return std::move(*shared);
  std::lock_guard lock(mutex_);
  if (closed_) return fail(errc::shutting_down, "registry is shutting down");
  return fail(errc::region_not_found, "no cached registration covers these bytes");
}

void RegistryCore::reserve_and_map(Registration reg, bool may_evict) {
  auto reservation = budget_->reserve(charge_for(reg.memory.data(), reg.memory.size()));
  if (!reservation) {
    std::vector<std::shared_ptr<Latch>> releasing;
    if (may_evict) {
      releasing = cache_->evict_idle(charge_for(reg.memory.data(), reg.memory.size()));
      // A guard just dropped still holds its bytes until the provider
      // confirms the unmap, a progress turn away: a caller that lets a
      // region go and registers another must not be refused for it.
      auto unmapping = unmaps_under_way();
      releasing.insert(releasing.end(), unmapping.begin(), unmapping.end());
    }
    if (!releasing.empty()) {
      // Once those have given their bytes back, once more.
      auto pending = std::make_shared<Registration>(std::move(reg));
      return after_all(releasing, [self = shared_from_this(), pending] {
        self->reserve_and_map(std::move(*pending), false);
      });
    }
    counters_.record_failure(reservation.error());
    reg.completion.post(backend_->progress_executor(), std::move(reservation).error(), std::move(reg.owned));
    return admitted_done();
  }
  reg.reservation = std::move(reservation).value();

  const auto memory = reg.memory;
  const auto access = reg.access;
  auto slot = reg.completion.cancellation_slot();
  backend_->async_map(
      memory.data(), memory.size(), access,
      asio::bind_cancellation_slot(
          slot, [self = shared_from_this(), reg = std::move(reg)](Result<BackendRegion> mapped) mutable {
            self->on_mapped(std::move(reg), std::move(mapped));
          }));
}

std::vector<std::shared_ptr<Latch>> RegistryCore::unmaps_under_way() const {
  std::vector<std::shared_ptr<RegionState>> regions;
  {
    std::lock_guard lock(mutex_);
    regions.reserve(live_.size());
    for (const auto& [generation, weak] : live_) {
      if (auto region = weak.lock()) regions.push_back(std::move(region));
    }
  }
  // Phases are read outside the registry's lock; one that moves on
  // meanwhile only makes the wait shorter.
  std::vector<std::shared_ptr<Latch>> latches;
  for (const auto& region : regions) {
    if (region->unmapping()) latches.push_back(region->deregistered());
  }
  return latches;
}

void RegistryCore::on_mapped(Registration reg, Result<BackendRegion> mapped) {
  if (!mapped) {
    reg.reservation = {};  // the budget is back before the caller hears of it
    counters_.record_failure(mapped.error());
    reg.completion.dispatch(std::move(mapped).error(), std::move(reg.owned));
    return admitted_done();
  }

  std::uint64_t generation = 0;
  bool closing = false;
  {
    std::lock_guard lock(mutex_);
    closing = closed_;
    generation = next_generation_++;
  }
  const std::uint64_t charged = reg.reservation.bytes();
  reg.reservation.commit();
  auto state = std::make_shared<RegionState>(shared_from_this(), std::move(mapped).value(), reg.memory,
                                             charged, generation, std::move(reg.owned));
  {
    std::lock_guard lock(mutex_);
    live_.emplace(generation, state);
  }
  RegistryCounters::bump(counters_.regions);
  if (closing) return roll_back(std::move(reg), state);

  RegistryCounters::bump(counters_.registrations);
  counters_.record_latency(std::chrono::steady_clock::now() - reg.started);
  // An undelivered guard is destroyed with the handler, which deregisters it
  // (or hands it back to the cache).
  RegionGuard guard = reg.cached ? cache_->adopt(std::move(state), reg.access, *reg.cached, std::move(reg.options))
                                 : RegionGuard(std::move(state));
  reg.completion.dispatch(std::move(guard), OwnedBuffer{});
  admitted_done();
}

void RegistryCore::roll_back(Registration reg, const std::shared_ptr<RegionState>& region) {
  // Admitted just before shutdown closed the gate, mapped after: deregistered
  // at once, as a region like any other. If the backend refuses the unmap,
  // the bytes (and an owned buffer) stay with that region, which shutdown
  // retries and latches like the rest: they are never charged to no region.
  // Shutdown waits for this registration, so it finds the region among the
  // live ones.
  auto pending = std::make_shared<Registration>(std::move(reg));
  region->request_deregistration([self = shared_from_this(), weak = std::weak_ptr(region),
                                  pending](const Result<void>& unmapped) {
    // A confirmed release hands an owned buffer back; otherwise the region
    // keeps it until its release is confirmed.
    OwnedBuffer buffer;
    if (auto released = weak.lock(); released && unmapped) buffer = released->take_owned();
    self->counters_.record_failure(Error{errc::shutting_down});
    pending->completion.dispatch(Error{errc::shutting_down, "registry shut down during registration"},
                                 std::move(buffer));
    self->admitted_done();
  });
}

void RegistryCore::admitted_done() {
  bool deregister = false;
  {
    std::lock_guard lock(mutex_);
    --admitted_;
    if (shutdown_.started && !shutdown_.deregistering && admitted_ == 0) {
      shutdown_.deregistering = deregister = true;
    }
  }
  if (deregister) deregister_all();
}

void RegistryCore::on_region_released(const RegionState& region) {
  budget_->release_committed(region.charged());
  counters_.regions.fetch_sub(1, std::memory_order_relaxed);
  RegistryCounters::bump(counters_.deregistrations);
  std::shared_ptr<RegionState> dropped;  // destroyed outside the lock
  std::lock_guard lock(mutex_);
  live_.erase(region.generation());
  if (auto it = unconfirmed_.find(region.generation()); it != unconfirmed_.end()) {
    dropped = std::move(it->second);
    unconfirmed_.erase(it);
  }
}

void RegistryCore::on_region_unconfirmed(const std::shared_ptr<RegionState>& region) {
  RegistryCounters::bump(counters_.unconfirmed_unmaps);
  std::lock_guard lock(mutex_);
  unconfirmed_.emplace(region->generation(), region);
}

void RegistryCore::registry_gone() {
  cache_->close();
  std::map<std::uint64_t, std::shared_ptr<RegionState>> dropped;
  std::lock_guard lock(mutex_);
  dropped.swap(unconfirmed_);
}

void RegistryCore::invalidate(std::span<const std::byte> memory,
                              asio::any_completion_handler<void(Result<void>)> handler) {
  auto completion = std::make_shared<Completion<void(Result<void>)>>(std::move(handler));
  const auto releasing = cache_->invalidate(memory);
  if (releasing.empty()) return completion->post(backend_->progress_executor(), success());
  after_all(releasing, [completion] { completion->dispatch(success()); });
}

void RegistryCore::start_shutdown(std::chrono::steady_clock::duration deadline,
                                  std::shared_ptr<asio::steady_timer> timer,
                                  asio::any_completion_handler<void(Result<void>)> handler) {
  Completion<void(Result<void>)> waiter(std::move(handler));
  cache_->close();  // shared no more; the idle ones go now
  bool first = false;
  bool deregister = false;
  {
    std::unique_lock lock(mutex_);
    closed_ = true;
    if (shutdown_.outcome) {
      auto outcome = *shutdown_.outcome;
      lock.unlock();
      return waiter.post(backend_->progress_executor(), std::move(outcome));
    }
    shutdown_.waiters.push_back(std::move(waiter));
    if (!shutdown_.started) {
      shutdown_.started = first = true;
      shutdown_.timer = timer;
      if (admitted_ == 0) shutdown_.deregistering = deregister = true;
    }
  }
  if (first) {
    timer->expires_after(deadline);
    timer->async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      if (ec) return;  // cancelled: shutdown finished in time
      if (auto self = weak.lock()) self->finish_shutdown(self->deadline_passed());
    });
  }
  if (deregister) deregister_all();
}

void RegistryCore::deregister_all() {
  std::vector<std::shared_ptr<RegionState>> regions;
  {
    std::lock_guard lock(mutex_);
    for (auto& [generation, weak] : live_) {
      if (auto region = weak.lock()) regions.push_back(std::move(region));
    }
  }
  // One extra count so that listeners answering inline cannot finish early.
  auto remaining = std::make_shared<std::atomic<std::size_t>>(regions.size() + 1);
  auto one_done = [self = shared_from_this(), remaining](const Result<void>&) {
    if (remaining->fetch_sub(1, std::memory_order_acq_rel) == 1) self->on_all_deregistered();
  };
  for (auto& region : regions) region->request_deregistration(one_done);
  one_done(success());
}

void RegistryCore::on_all_deregistered() {
  const auto live = backend_->live_registrations();
  if (!live) return finish_shutdown(fail(errc::backend, "backend cannot count its registrations"));
  if (*live != 0) return look_again(*live);
  // The backend holds nothing: every region whose unmap went unconfirmed is
  // released after all.
  std::vector<std::shared_ptr<RegionState>> regions;
  {
    std::lock_guard lock(mutex_);
    for (auto& [generation, weak] : live_) {
      if (auto region = weak.lock()) regions.push_back(std::move(region));
    }
    for (auto& [generation, region] : unconfirmed_) regions.push_back(region);
  }
  for (auto& region : regions) region->confirm_released_by_shutdown();
  finish_shutdown(success());
}

void RegistryCore::look_again(std::size_t live) {
  // A backend shutting down refuses our unmaps at once but holds its
  // registrations until it has drained its transfers and unmapped everything;
  // live_registrations() comes with no notification. So look again, backing
  // off, until it holds none or the deadline answers the shutdown.
  constexpr std::chrono::milliseconds first_look{1};
  constexpr std::chrono::milliseconds slowest_look{64};
  std::shared_ptr<asio::steady_timer> later;
  {
    std::lock_guard lock(mutex_);
    if (shutdown_.outcome || !shutdown_.timer) return;
    shutdown_.still_live = live;
    shutdown_.next_look = std::clamp(2 * shutdown_.next_look, first_look, slowest_look);
    later = std::make_shared<asio::steady_timer>(shutdown_.timer->get_executor(), shutdown_.next_look);
  }
  later->async_wait([weak = weak_from_this(), later](boost::system::error_code) {
    if (auto self = weak.lock()) self->on_all_deregistered();
  });
}

Error RegistryCore::deadline_passed() const {
  std::lock_guard lock(mutex_);
  std::string detail = "registry shutdown passed its deadline";
  if (shutdown_.still_live != 0) {
    detail += " with " + std::to_string(shutdown_.still_live) + " registrations still live in the backend";
  }
  return Error{errc::timeout, std::move(detail)};
}

void RegistryCore::finish_shutdown(Result<void> outcome) {
  std::vector<Completion<void(Result<void>)>> waiters;
  std::shared_ptr<asio::steady_timer> timer;
  {
    std::lock_guard lock(mutex_);
    if (shutdown_.outcome) return;
    shutdown_.outcome = outcome;
    waiters.swap(shutdown_.waiters);
    timer = std::move(shutdown_.timer);
  }
  // Cancelling a timer from another thread is not safe; post it to the
  // timer's own executor.
  if (timer) asio::post(timer->get_executor(), [timer] { timer->cancel(); });
  for (auto& waiter : waiters) waiter.dispatch(outcome);
}

RegistryStats RegistryCore::stats() const {
  RegistryStats stats;
  counters_.snapshot(stats);
  stats.budget_bytes = budget_->limit();
  stats.registered_bytes = budget_->committed();
  stats.reserved_bytes = budget_->reserved();
  const auto cache = cache_->stats();
  stats.cache_hits = cache.hits;
  stats.cache_misses = cache.misses;
  stats.cache_evictions = cache.evictions;
  stats.cache_idle_bytes = cache.idle_bytes;
  return stats;
}

}  // namespace corma::detail
