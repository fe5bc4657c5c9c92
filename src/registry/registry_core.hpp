// The state a Registry shares with its guards: budget, admission gate, live
// regions, shutdown and counters. Outlives the Registry object while any
// guard or background deregistration needs it.
#pragma once

#include "budget.hpp"
#include "region_state.hpp"
#include "registration_cache.hpp"
#include "registry_counters.hpp"

#include <corma/detail/completion.hpp>
#include <corma/registry.hpp>

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace corma::detail {

class RegistryCore : public std::enable_shared_from_this<RegistryCore> {
 public:
  /// Internal completion of a registration: the guard, or the error plus the
  /// owned buffer handed back (empty for caller-owned memory).
  using RegistrationDone =
      asio::any_completion_handler<void(Result<RegionGuard>, OwnedBuffer)>;

  RegistryCore(std::shared_ptr<RdmaBackend> backend, RegistryConfig config);

  /// `options` matter for caller memory only: owned memory is never cached.
  void start_registration(std::span<std::byte> memory, Access access, RegistrationOptions options, OwnedBuffer owned,
                          RegistrationDone done);
  void start_shutdown(std::chrono::steady_clock::duration deadline,
                      std::shared_ptr<asio::steady_timer> timer,
                      asio::any_completion_handler<void(Result<void>)> handler);

  [[nodiscard]] Result<RegionGuard> find_cached(std::span<std::byte> memory, Access access);
  /// Ends caching of what overlaps `memory`; answers once all of it is released.
  void invalidate(std::span<const std::byte> memory, asio::any_completion_handler<void(Result<void>)> handler);

  /// The Registry object went without a shutdown: drops the strong hold on
  /// unconfirmed regions (they can no longer be confirmed) and closes the
  /// cache (its idle registrations are deregistered).
  void registry_gone();

  [[nodiscard]] RegistryStats stats() const;
  [[nodiscard]] std::uint64_t charge_for(const void* ptr, std::size_t len) const noexcept;
  [[nodiscard]] const std::shared_ptr<RdmaBackend>& backend() const noexcept { return backend_; }
  [[nodiscard]] RegistryCounters& counters() noexcept { return counters_; }

  // Called by RegionState.
  void on_region_released(const RegionState& region);
  void on_region_unconfirmed(const std::shared_ptr<RegionState>& region);

 private:
  struct Registration;

  /// Reserves the budget and maps. With no room and `may_evict`, it first
  /// takes idle cached registrations back and waits for them and for every
  /// unmap already under way, then tries once more.
  void reserve_and_map(Registration registration, bool may_evict);
  /// The release latches of regions whose unmap is out (no transfer left
  /// to wait for): their bytes come back within a progress turn.
  [[nodiscard]] std::vector<std::shared_ptr<Latch>> unmaps_under_way() const;
  void on_mapped(Registration registration, Result<BackendRegion> mapped);
  void roll_back(Registration registration, const std::shared_ptr<RegionState>& region);
  void admitted_done();
  void deregister_all();
  void on_all_deregistered();
  void look_again(std::size_t live);
  [[nodiscard]] Error deadline_passed() const;
  void finish_shutdown(Result<void> outcome);

  const std::shared_ptr<RdmaBackend> backend_;
  const std::size_t page_size_;
  const std::shared_ptr<Budget> budget_;
  const bool cache_by_default_;  // config.cache_registrations
  const std::unique_ptr<RegistrationCache> cache_;
  RegistryCounters counters_;

  mutable std::mutex mutex_;
  bool closed_ = false;
  std::uint64_t admitted_ = 0;
  std::uint64_t next_generation_ = 1;
  std::map<std::uint64_t, std::weak_ptr<RegionState>> live_;
  std::map<std::uint64_t, std::shared_ptr<RegionState>> unconfirmed_;

  struct Shutdown {
    bool started = false;
    bool deregistering = false;
    std::optional<Result<void>> outcome;
    std::shared_ptr<asio::steady_timer> timer;
    std::vector<Completion<void(Result<void>)>> waiters;
    std::size_t still_live = 0;  // what the backend held at the last look
    std::chrono::milliseconds next_look{0};
  } shutdown_;
};

}  // namespace corma::detail
