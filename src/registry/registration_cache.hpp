// The registry's registration cache: registrations kept by address so that
// a registration of bytes one of them already covers, with at most its
// access, shares it (no backend call, no second charge) through a guard
// naming just the bytes asked for. A registration with no guard left stays
// cached, idle, while the idle ones fit their share of the budget, and goes
// least recently used first; the budget takes idle ones back when it needs
// room. Registrations asked to be kept (Caching::keep) stay idle until the
// budget needs them: the idle share bounds the others. Only registrations
// made with caching on are in it.
#pragma once

#include "guard_share.hpp"
#include "region_state.hpp"

#include <corma/region_guard.hpp>
#include <corma/registry.hpp>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace corma::detail {

class RegistrationCache {
 public:
  RegistrationCache(std::uint64_t idle_limit, bool share_exposed) noexcept
      : idle_limit_(idle_limit), share_exposed_(share_exposed) {}
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  /// A guard for `memory` sharing a cached registration that covers it, or
  /// nothing. A guard exposed to peers (`access` not local) shares only a
  /// registration of exactly its bytes, unless exposed sharing is on: a
  /// peer with the key reaches the whole registration. `count_miss`: a
  /// registration follows if nothing is found.
  [[nodiscard]] std::optional<RegionGuard> share(std::span<std::byte> memory, Access access, bool count_miss);

  /// Keeps a fresh registration (`state`, made with `access` and `options`)
  /// for sharing; the guard for the caller who made it, naming `memory`
  /// inside it.
  [[nodiscard]] RegionGuard adopt(std::shared_ptr<RegionState> state, Access access, std::span<std::byte> memory,
                                  RegistrationOptions options);

  /// Idle registrations, least recently used first, until `bytes` charged
  /// are on their way back: their release events (none when nothing is idle).
  [[nodiscard]] std::vector<std::shared_ptr<Latch>> evict_idle(std::uint64_t bytes);

  /// Every registration overlapping `memory` is shared no more and goes
  /// once its guards have: their release events.
  [[nodiscard]] std::vector<std::shared_ptr<Latch>> invalidate(std::span<const std::byte> memory);

  /// Shutdown or the registry's end: nothing is shared or kept idle again
  /// (the idle ones are deregistered now).
  void close();

  struct Stats {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::uint64_t evictions = 0;
    std::uint64_t idle_bytes = 0;
    std::uint64_t entries = 0;
  };
  [[nodiscard]] Stats stats() const;

 private:
  class Entry;
  using Lru = std::list<Entry*>;  // the map below keeps each one alive

  /// A guard of `entry` went (its share came back).
  void on_returned(Entry& entry);
  /// Its guard asked for it to be deregistered: not kept idle.
  void on_deregister_asked(Entry& entry);
  /// Takes `entry` out of the cache; call with the lock held, and hold a
  /// reference to it if it is used afterwards. Its deregistration is
  /// requested by the caller, outside the lock.
  void remove_locked(Entry& entry);
  [[nodiscard]] RegionGuard guard_for(const std::shared_ptr<Entry>& entry, std::span<std::byte> memory);
  /// Idle ones bounded by the idle limit beyond it, least recently used
  /// first; lock held.
  void trim_locked(std::vector<std::shared_ptr<Entry>>& evicted);
  /// Marks idle `entry` in use again, or takes it off the idle list; lock held.
  void leave_idle_locked(Entry& entry);
  /// Deregisters what `evicted` holds and tells whoever asked to hear of it.
  static void let_go(const std::vector<std::shared_ptr<Entry>>& evicted);

  const std::uint64_t idle_limit_;
  const bool share_exposed_;

  mutable std::mutex mutex_;
  bool closed_ = false;
  std::multimap<std::uintptr_t, std::shared_ptr<Entry>> by_start_;  // by the first registered byte
  Lru idle_;                                                        // least recently used first
  Stats stats_;
  std::uint64_t bounded_idle_bytes_ = 0;  // charged to idle ones the idle limit bounds
  std::uint64_t largest_ = 0;  // the longest registration in the cache: bounds the look-up
};

}  // namespace corma::detail
