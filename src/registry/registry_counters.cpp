#include "registry_counters.hpp"

#include "arena_core.hpp"

#include <bit>

namespace corma {

std::uint64_t LatencyHistogram::total() const noexcept {
  std::uint64_t n = 0;
  for (auto c : counts) n += c;
  return n;
}

std::size_t LatencyHistogram::bucket_for(std::chrono::nanoseconds latency) noexcept {
  const auto us = static_cast<std::uint64_t>(std::max<std::int64_t>(0, latency.count() / 1000));
  const auto bucket = static_cast<std::size_t>(std::bit_width(us));
  return std::min(bucket, bucket_count - 1);
}

std::chrono::microseconds LatencyHistogram::quantile_upper_bound(double q) const noexcept {
  const std::uint64_t n = total();
  if (n == 0) return std::chrono::microseconds{0};
  const auto wanted = static_cast<std::uint64_t>(q * static_cast<double>(n) + 0.999999);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < bucket_count; ++i) {
    seen += counts[i];
    if (seen >= wanted) return std::chrono::microseconds{std::uint64_t{1} << i};
  }
  return std::chrono::microseconds{std::uint64_t{1} << (bucket_count - 1)};
}

namespace detail {

void RegistryCounters::record_latency(std::chrono::nanoseconds elapsed) noexcept {
  bump(latency[LatencyHistogram::bucket_for(elapsed)]);
  latency_sum_ns.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(0, elapsed.count())),
                           std::memory_order_relaxed);
}

void RegistryCounters::record_failure(const Error& error) noexcept {
  if (error.is(errc::budget_exceeded)) {
    bump(refused_budget);
  } else if (error.is(errc::shutting_down)) {
    bump(refused_shutting_down);
  } else if (error.is(errc::out_of_range)) {
    bump(refused_invalid);
  } else if (error.is(errc::cancelled)) {
    bump(cancelled);
  } else {
    bump(failed_backend);
  }
}

void RegistryCounters::add_arena(const ArenaCore* arena) {
  std::lock_guard lock(arenas_mutex_);
  live_arenas_.push_back(arena);
}

void RegistryCounters::remove_arena(const ArenaCore* arena) noexcept {
  std::lock_guard lock(arenas_mutex_);
  std::erase(live_arenas_, arena);
}

void RegistryCounters::snapshot(RegistryStats& stats) const noexcept {
  constexpr auto relaxed = std::memory_order_relaxed;
  stats.regions = regions.load(relaxed);
  stats.registrations = registrations.load(relaxed);
  stats.deregistrations = deregistrations.load(relaxed);
  stats.refused_budget = refused_budget.load(relaxed);
  stats.refused_shutting_down = refused_shutting_down.load(relaxed);
  stats.refused_invalid = refused_invalid.load(relaxed);
  stats.failed_backend = failed_backend.load(relaxed);
  stats.cancelled = cancelled.load(relaxed);
  stats.unconfirmed_unmaps = unconfirmed_unmaps.load(relaxed);
  stats.leaked_owned_buffers = leaked_owned_buffers.load(relaxed);
  stats.arenas = arenas.load(relaxed);
  stats.arena_capacity_bytes = arena_capacity_bytes.load(relaxed);
  {
    std::lock_guard lock(arenas_mutex_);
    for (const auto* arena : live_arenas_) {
      const auto counted = arena->stats();
      stats.arena_allocated_bytes += counted.allocated_bytes;
      stats.arena_slices += counted.slices;
    }
  }
  for (std::size_t i = 0; i < latency.size(); ++i) {
    stats.registration_latency.counts[i] = latency[i].load(relaxed);
  }
  stats.registration_latency.sum = std::chrono::nanoseconds{static_cast<std::int64_t>(latency_sum_ns.load(relaxed))};
}

}  // namespace detail
}  // namespace corma
