// Registry: byte-budgeted registration of memory with an RdmaBackend.
#pragma once

#include <corma/arena.hpp>
#include <corma/backend.hpp>
#include <corma/error.hpp>
#include <corma/owned_buffer.hpp>
#include <corma/region_guard.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace corma {

struct RegistryConfig {
  /// Registered bytes (whole pages) the registry may hold at once: the
  /// RLIMIT_MEMLOCK axis. A region's bytes count until the provider has
  /// confirmed its unmap; a registration that does not fit waits for the
  /// unmaps already under way (guards just dropped) before it is refused.
  std::uint64_t budget_bytes = 0;
  /// Page size used to compute charges; 0 means the system's.
  std::size_t page_size = 0;
  /// The registration cache (docs/architecture.md, "Registration cache and
  /// arenas"), for caller memory: a registration of bytes that a cached
  /// registration with at least the same access already covers shares it,
  /// with no backend call and no second charge. Opt-in, because the cache
  /// keeps memory registered after its guards went: the caller must call
  /// async_invalidate before it frees or remaps memory it registered.
  /// Off, only registrations asking for it (`Caching::keep`) are cached.
  bool cache_registrations = false;
  /// The share of the budget that cached registrations with no guard left
  /// may hold; beyond it the least recently used go. The budget takes idle
  /// ones back before it refuses a registration `budget_exceeded`.
  double cache_idle_share = 0.25;
  /// A guard exposed to peers shares only a registration of exactly its
  /// bytes, since a peer with the key reaches the whole registration;
  /// true lets it share a wider one (for peers trusted with all of it).
  bool share_exposed_registrations = false;
};

/// Whether one registration goes into the registry's cache.
enum class Caching : std::uint8_t {
  /// As RegistryConfig::cache_registrations says.
  registry_default,
  /// Into the cache even with cache_registrations off, sharing a cached
  /// registration that covers it, and kept idle when its guards are gone
  /// until the budget needs its room or it is invalidated (not bounded by
  /// cache_idle_share): for memory the caller keeps alive through
  /// `RegistrationOptions::keepalive`, or invalidates before freeing.
  keep,
  /// Registered anew, and never shared or kept.
  never,
};

/// How Registry::async_register treats one registration.
struct RegistrationOptions {
  Caching caching = Caching::registry_default;
  /// Held by a registration this call puts into the cache until that
  /// registration is released (not only until its guards go): the owner of
  /// the bytes, so memory kept registered idle cannot be freed under it.
  std::shared_ptr<const void> keepalive;
  /// Called, on the thread that evicts, when the cache lets the
  /// registration this call made go for room (the budget, or the idle
  /// share); not for invalidation or shutdown.
  std::function<void()> on_evicted;
};

/// Registration latency in power-of-two microsecond buckets: bucket 0 holds
/// everything under 1 µs, bucket i holds [2^(i-1), 2^i) µs, the last one the rest.
struct LatencyHistogram {
  static constexpr std::size_t bucket_count = 24;
  std::array<std::uint64_t, bucket_count> counts{};
  std::chrono::nanoseconds sum{0};  ///< of every latency counted

  [[nodiscard]] std::uint64_t total() const noexcept;
  /// Upper bound of the bucket holding the q-quantile (0 < q <= 1).
  [[nodiscard]] std::chrono::microseconds quantile_upper_bound(double q) const noexcept;
  [[nodiscard]] static std::size_t bucket_for(std::chrono::nanoseconds latency) noexcept;
};

/// A snapshot of a registry's counters; cheap to take.
struct RegistryStats {
  std::uint64_t budget_bytes = 0;
  std::uint64_t registered_bytes = 0;  ///< committed to live regions
  std::uint64_t reserved_bytes = 0;    ///< held for maps still in progress
  std::uint64_t regions = 0;           ///< live regions (not yet released)
  std::uint64_t registrations = 0;     ///< successful registrations, ever
  std::uint64_t deregistrations = 0;   ///< confirmed releases, ever
  std::uint64_t refused_budget = 0;
  std::uint64_t refused_shutting_down = 0;
  std::uint64_t refused_invalid = 0;
  std::uint64_t failed_backend = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t unconfirmed_unmaps = 0;
  std::uint64_t leaked_owned_buffers = 0;  ///< freed never: release unconfirmed
  std::uint64_t cache_hits = 0;        ///< registrations that shared a cached one
  std::uint64_t cache_misses = 0;      ///< registrations the cache could not serve
  std::uint64_t cache_evictions = 0;   ///< idle cached registrations let go
  std::uint64_t cache_idle_bytes = 0;  ///< charged to cached registrations with no guard
  std::uint64_t arenas = 0;                 ///< arenas whose registration is live
  std::uint64_t arena_capacity_bytes = 0;   ///< their memory
  std::uint64_t arena_allocated_bytes = 0;  ///< in slices handed out (by class size)
  std::uint64_t arena_slices = 0;           ///< slices handed out and not yet back
  LatencyHistogram registration_latency;
};

/// A failed owned registration hands its buffer back with the error (empty
/// in the one case Registry::async_register_owned describes).
struct OwnedRegistrationFailure {
  Error error;
  OwnedBuffer buffer;
};
[[nodiscard]] inline const std::error_code& make_error_code(const OwnedRegistrationFailure& f) noexcept {
  return f.error.code;
}
[[noreturn]] void outcome_throw_as_system_error_with_payload(const OwnedRegistrationFailure& f);

using OwnedResult = Result<RegionGuard, OwnedRegistrationFailure>;

/// Registers memory under a byte budget and hands out RegionGuards. The
/// Registry object may be destroyed while guards live: they keep what they
/// need, and their background deregistration still completes. Its
/// operations hold the shared core, not the Registry object: one created
/// with `asio::deferred` still works when launched after the object moved or
/// was destroyed.
class Registry {
 public:
  Registry(std::shared_ptr<RdmaBackend> backend, RegistryConfig config);
  Registry(Registry&&) noexcept;
  Registry& operator=(Registry&&) noexcept;
  ~Registry();

  /// Registers caller-owned memory, which must stay valid until the guard's
  /// deregistered() resolves.
  template <asio::completion_token_for<void(Result<RegionGuard>)> Token>
  auto async_register(std::span<std::byte> memory, Access access, Token&& token) {
    return async_register(memory, access, RegistrationOptions{}, std::forward<Token>(token));
  }

  /// The same, with the cache's treatment of this registration chosen.
  template <asio::completion_token_for<void(Result<RegionGuard>)> Token>
  auto async_register(std::span<std::byte> memory, Access access, RegistrationOptions options, Token&& token) {
    return asio::async_initiate<Token, void(Result<RegionGuard>)>(
        [core = core_](auto handler, std::span<std::byte> m, Access a, RegistrationOptions o) {
          do_register(core, m, a, std::move(o), std::move(handler));
        },
        token, memory, access, std::move(options));
  }

  /// Registers memory the registry then owns; it is freed after confirmed
  /// release. On failure (budget_exceeded is routine) the buffer comes back,
  /// with one exception: a registration mapped just as the registry's
  /// shutdown closed its gate is rolled back, and if the backend refuses
  /// that unmap (it is shutting down too), the provider may still hold the
  /// memory, so the `shutting_down` failure carries an empty buffer; the
  /// registry frees the buffer itself once the release is confirmed (at the
  /// latest when its shutdown finds the backend holding nothing), or keeps
  /// it as leaked (stats().leaked_owned_buffers) if that never happens.
  template <asio::completion_token_for<void(OwnedResult)> Token>
  auto async_register_owned(OwnedBuffer buffer, Access access, Token&& token) {
    return asio::async_initiate<Token, void(OwnedResult)>(
        [core = core_](auto handler, OwnedBuffer b, Access a) {
          do_register_owned(core, std::move(b), a, std::move(handler));
        },
        token, std::move(buffer), access);
  }

  /// The cache's answer alone, at once, on this thread: a guard for
  /// `memory` sharing a cached registration that covers it (the rules of
  /// async_register), or `region_not_found` when none does (register it
  /// with async_register; a look-up that finds nothing is not counted a
  /// miss, the registration that follows is), `out_of_range` for a bad
  /// range, `shutting_down` once shutdown began. With cache_registrations
  /// off it finds the registrations made with `Caching::keep`.
  [[nodiscard]] Result<RegionGuard> find_cached(std::span<std::byte> memory, Access access);

  /// Ends caching of every registration overlapping `memory`: the idle ones
  /// are deregistered now, the others once their guards go. Completes when
  /// all of them are released, after which the memory may be freed or
  /// reused.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_invalidate(std::span<const std::byte> memory, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [core = core_](auto handler, std::span<const std::byte> m) { do_invalidate(core, m, std::move(handler)); },
        token, memory);
  }

  /// An arena (Arena) of at least `bytes`, rounded up to whole chunks of
  /// `config.max_slice`: memory the registry owns, registered once with
  /// `config.access` and charged to the budget once; its slices cost no
  /// backend call. Refused like a registration (`budget_exceeded` is
  /// routine), and `out_of_range` for a config it cannot cut.
  template <asio::completion_token_for<void(Result<Arena>)> Token>
  auto async_make_arena(std::size_t bytes, ArenaConfig config, Token&& token) {
    return asio::async_initiate<Token, void(Result<Arena>)>(
        [core = core_](auto handler, std::size_t b, ArenaConfig c) { do_make_arena(core, b, c, std::move(handler)); },
        token, bytes, config);
  }

  /// Closes admission (new registrations get `shutting_down`), waits for the
  /// admitted ones, deregisters everything, and latches every region's
  /// deregistered() once the backend reports zero live registrations
  /// (looking again while a backend shutting down itself still drains).
  /// Safe in any order with the backend's shutdown; cheapest before it,
  /// unless a transfer was stranded with a dead peer (UCX over shared
  /// memory): its region is released only by the backend's shutdown, so
  /// start that one too without waiting for this one (docs/architecture.md).
  /// Completes with `timeout` if that takes longer than `deadline`.
  /// Idempotent: later calls complete with the first call's outcome.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_shutdown(std::chrono::steady_clock::duration deadline, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [core = core_](auto handler, std::chrono::steady_clock::duration d) {
          // The deadline timer runs on the caller's executor.
          auto timer = std::make_shared<asio::steady_timer>(asio::get_associated_executor(handler));
          do_shutdown(core, d, std::move(timer), std::move(handler));
        },
        token, deadline);
  }

  [[nodiscard]] RegistryStats stats() const;

  /// The bytes a registration of [ptr, ptr + len) charges: its enclosing pages.
  [[nodiscard]] std::uint64_t charge_for(const void* ptr, std::size_t len) const noexcept;

  [[nodiscard]] const std::shared_ptr<RdmaBackend>& backend() const noexcept;

 private:
  using Core = std::shared_ptr<detail::RegistryCore>;
  static void do_register(const Core& core, std::span<std::byte> memory, Access access, RegistrationOptions options,
                          asio::any_completion_handler<void(Result<RegionGuard>)> handler);
  static void do_register_owned(const Core& core, OwnedBuffer buffer, Access access,
                                asio::any_completion_handler<void(OwnedResult)> handler);
  static void do_invalidate(const Core& core, std::span<const std::byte> memory,
                            asio::any_completion_handler<void(Result<void>)> handler);
  static void do_make_arena(const Core& core, std::size_t bytes, ArenaConfig config,
                            asio::any_completion_handler<void(Result<Arena>)> handler);
  static void do_shutdown(const Core& core, std::chrono::steady_clock::duration deadline,
                          std::shared_ptr<asio::steady_timer> timer,
                          asio::any_completion_handler<void(Result<void>)> handler);

  std::shared_ptr<detail::RegistryCore> core_;
};

}  // namespace corma
