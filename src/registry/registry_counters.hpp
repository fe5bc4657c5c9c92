// Lock-free counters behind RegistryStats.
#pragma once

#include <corma/registry.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace corma::detail {

class ArenaCore;

struct RegistryCounters {
  using Counter = std::atomic<std::uint64_t>;

  Counter regions{0};
  Counter registrations{0};
  Counter deregistrations{0};
  Counter refused_budget{0};
  Counter refused_shutting_down{0};
  Counter refused_invalid{0};
  Counter failed_backend{0};
  Counter cancelled{0};
  Counter unconfirmed_unmaps{0};
  Counter leaked_owned_buffers{0};
  // Arenas made from this registry (gauges: up and down).
  Counter arenas{0};
  Counter arena_capacity_bytes{0};
  std::array<Counter, LatencyHistogram::bucket_count> latency{};
  Counter latency_sum_ns{0};

  static void bump(Counter& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }
  void record_latency(std::chrono::nanoseconds elapsed) noexcept;
  /// Counts a failed registration under its reason.
  void record_failure(const Error& error) noexcept;
  /// Copies every counter into `stats` (budget figures are filled elsewhere).
  void snapshot(RegistryStats& stats) const noexcept;

  // Each arena counts its slices under its own lock, and they are summed
  // here when asked: taking a slice touches no registry-wide atomic.
  void add_arena(const ArenaCore* arena);
  /// First thing in the arena's destructor, while its stats can still be read.
  void remove_arena(const ArenaCore* arena) noexcept;

 private:
  mutable std::mutex arenas_mutex_;
  std::vector<const ArenaCore*> live_arenas_;
};

}  // namespace corma::detail
