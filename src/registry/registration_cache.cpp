#include "registration_cache.hpp"

#include <algorithm>
#include <utility>

namespace corma::detail {

/// One cached registration: the guards sharing it are its shares.
class RegistrationCache::Entry final : public ShareOwner, public std::enable_shared_from_this<Entry> {
 public:
  Entry(RegistrationCache& owner, std::shared_ptr<RegionState> registration, Access registered,
        RegistrationOptions options) noexcept
      : cache(owner),
        state(std::move(registration)),
        access(registered),
        bounded(options.caching != Caching::keep),
        keepalive(std::move(options.keepalive)),
        on_evicted(std::move(options.on_evicted)) {}
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() override {
    // The bytes outlive their registration: let go once its release is
    // confirmed (never, if it never is).
    if (keepalive && !state->deregistered()->is_set()) {
      state->deregistered()->wait([keep = std::move(keepalive)](Result<void>) {});
    }
  }

  void give_back(std::uint64_t /*offset*/, std::uint64_t /*len*/) noexcept override {
    cache.on_returned(*this);
  }
  [[nodiscard]] std::weak_ptr<RdmaBackend> backend() const override { return state->backend(); }
  [[nodiscard]] std::shared_ptr<Latch> memory_released() const override { return state->deregistered(); }
  void deregistration_asked() override { cache.on_deregister_asked(*this); }

  [[nodiscard]] std::uintptr_t start() const noexcept {
    return reinterpret_cast<std::uintptr_t>(state->memory().data());
  }
  [[nodiscard]] std::uintptr_t end() const noexcept { return start() + state->memory().size(); }

  // The state keeps the registry core, and with it the cache, alive.
  RegistrationCache& cache;
  const std::shared_ptr<RegionState> state;
  const Access access;
  const bool bounded;  ///< by the idle limit (not asked to be kept)
  std::shared_ptr<const void> keepalive;
  const std::function<void()> on_evicted;
  // Under the cache's lock:
  std::uint64_t guards = 0;
  bool in_cache = true;         ///< shared and kept idle; false once removed
  bool keep_when_idle = true;   ///< false once a guard asked for deregistration
  bool idle = false;            ///< its node is in the idle list
  // Its node for the idle list, kept in `parked` while it is in use: going
  // idle and back splices the node across, with no allocation.
  Lru parked{this};
  const Lru::iterator node = parked.begin();
};

namespace {

bool covers(Access registered, Access wanted) {
  const auto have = static_cast<unsigned>(registered);
  const auto want = static_cast<unsigned>(wanted);
  return (have & want) == want;
}

void deregister_all(const std::vector<std::shared_ptr<RegionState>>& going) {
  for (const auto& state : going) state->request_deregistration({});
}

}  // namespace

void RegistrationCache::let_go(const std::vector<std::shared_ptr<Entry>>& evicted) {
  for (const auto& entry : evicted) {
    entry->state->request_deregistration({});
    if (entry->on_evicted) entry->on_evicted();
  }
}

std::optional<RegionGuard> RegistrationCache::share(std::span<std::byte> memory, Access access, bool count_miss) {
  const auto first = reinterpret_cast<std::uintptr_t>(memory.data());
  const auto last = first + memory.size();
  std::lock_guard lock(mutex_);
  if (closed_) return std::nullopt;
  // Registrations starting at most `largest_` bytes before the range.
  auto it = by_start_.lower_bound(first >= largest_ ? first - largest_ : 0);
  for (; it != by_start_.end() && it->first <= first; ++it) {
    const auto& entry = it->second;
    if (entry->end() < last || !covers(entry->access, access)) continue;
    // A peer with the key reaches the whole registration.
    const bool exact = entry->start() == first && entry->end() == last;
    if (access != Access::local && !exact && !share_exposed_) continue;
    leave_idle_locked(*entry);
    ++entry->guards;
    ++stats_.hits;
    return guard_for(entry, memory);
  }
  if (count_miss) ++stats_.misses;
  return std::nullopt;
}

RegionGuard RegistrationCache::adopt(std::shared_ptr<RegionState> state, Access access, std::span<std::byte> memory,
                                     RegistrationOptions options) {
  auto entry = std::make_shared<Entry>(*this, std::move(state), access, std::move(options));
  entry->guards = 1;
  std::lock_guard lock(mutex_);
  if (closed_) {
    entry->in_cache = false;
  } else {
    by_start_.emplace(entry->start(), entry);
    largest_ = std::max<std::uint64_t>(largest_, entry->state->memory().size());
    ++stats_.entries;
  }
  return guard_for(entry, memory);
}

RegionGuard RegistrationCache::guard_for(const std::shared_ptr<Entry>& entry, std::span<std::byte> memory) {
  const auto offset = static_cast<std::uint64_t>(memory.data() - entry->state->memory().data());
  return RegionGuard(entry->state,
                     std::make_shared<GuardShare>(entry, offset, memory.size()));
}

void RegistrationCache::on_returned(Entry& entry) {
  // The returning share holds `entry` until this is done.
  std::shared_ptr<RegionState> going;
  std::vector<std::shared_ptr<Entry>> evicted;
  {
    std::lock_guard lock(mutex_);
    if (--entry.guards != 0) return;
    if (!entry.in_cache || !entry.keep_when_idle) {
      if (entry.in_cache) remove_locked(entry);
      going = entry.state;
    } else {
      idle_.splice(idle_.end(), entry.parked, entry.node);
      entry.idle = true;
      stats_.idle_bytes += entry.state->charged();
      if (entry.bounded) bounded_idle_bytes_ += entry.state->charged();
      trim_locked(evicted);
    }
  }
  if (going) going->request_deregistration({});
  let_go(evicted);
}

void RegistrationCache::on_deregister_asked(Entry& entry) {
  std::lock_guard lock(mutex_);
  entry.keep_when_idle = false;  // its last guard's return deregisters it
}

void RegistrationCache::leave_idle_locked(Entry& entry) {
  if (!entry.idle) return;
  stats_.idle_bytes -= entry.state->charged();
  if (entry.bounded) bounded_idle_bytes_ -= entry.state->charged();
  entry.parked.splice(entry.parked.end(), idle_, entry.node);
  entry.idle = false;
}

void RegistrationCache::remove_locked(Entry& entry) {
  leave_idle_locked(entry);
  entry.in_cache = false;
  --stats_.entries;
  // Last: the map's reference may be the one that keeps `entry` alive.
  auto [first, last] = by_start_.equal_range(entry.start());
  for (auto it = first; it != last; ++it) {
    if (it->second.get() == &entry) {
      by_start_.erase(it);
      break;
    }
  }
}

void RegistrationCache::trim_locked(std::vector<std::shared_ptr<Entry>>& evicted) {
  for (auto it = idle_.begin(); bounded_idle_bytes_ > idle_limit_ && it != idle_.end();) {
    Entry& entry = **it++;  // removing it moves its node out of the list
    if (!entry.bounded) continue;
    evicted.push_back(entry.shared_from_this());
    remove_locked(entry);
    ++stats_.evictions;
  }
}

std::vector<std::shared_ptr<Latch>> RegistrationCache::evict_idle(std::uint64_t bytes) {
  std::vector<std::shared_ptr<Entry>> evicted;
  std::vector<std::shared_ptr<Latch>> released;
  {
    std::lock_guard lock(mutex_);
    std::uint64_t freed = 0;
    while (freed < bytes && !idle_.empty()) {
      auto oldest = idle_.front()->shared_from_this();
      freed += oldest->state->charged();
      remove_locked(*oldest);
      released.push_back(oldest->state->deregistered());
      evicted.push_back(std::move(oldest));
      ++stats_.evictions;
    }
  }
  let_go(evicted);
  return released;
}

std::vector<std::shared_ptr<Latch>> RegistrationCache::invalidate(std::span<const std::byte> memory) {
  const auto first = reinterpret_cast<std::uintptr_t>(memory.data());
  const auto last = first + memory.size();
  std::vector<std::shared_ptr<RegionState>> going;
  std::vector<std::shared_ptr<Latch>> released;
  std::vector<std::shared_ptr<Entry>> overlapping;  // destroyed outside the lock
  {
    std::lock_guard lock(mutex_);
    auto it = by_start_.lower_bound(first >= largest_ ? first - largest_ : 0);
    for (; it != by_start_.end() && it->first < last; ++it) {
      if (it->second->end() > first) overlapping.push_back(it->second);
    }
    for (const auto& entry : overlapping) {
      // Idle: deregistered now; in use: once its last guard goes.
      if (entry->idle) going.push_back(entry->state);
      remove_locked(*entry);
      released.push_back(entry->state->deregistered());
    }
  }
  deregister_all(going);
  return released;
}

void RegistrationCache::close() {
  std::vector<std::shared_ptr<RegionState>> going;
  std::vector<std::shared_ptr<Entry>> all;  // destroyed outside the lock
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    for (auto& [start, entry] : by_start_) all.push_back(entry);
    for (const auto& entry : all) {
      if (entry->idle) going.push_back(entry->state);
      remove_locked(*entry);
    }
  }
  deregister_all(going);
}

RegistrationCache::Stats RegistrationCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace corma::detail
