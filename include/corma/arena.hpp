// Arena: one registration carved into slices for small transfers. A slice
// is a RegionGuard like any other; taking one costs no backend call and no
// thread crossing, and the registry's budget was charged once, for the
// whole arena, when it was made (Registry::async_make_arena).
#pragma once

#include <corma/backend.hpp>
#include <corma/error.hpp>
#include <corma/region_guard.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace corma {

namespace detail {
class ArenaCore;
}  // namespace detail

/// How an arena cuts its memory. Slices come in size classes, powers of two
/// from `min_slice` to `max_slice`; a request takes the smallest class that
/// holds it. The memory is carved into chunks of `max_slice` bytes, each
/// split into one class's slices the first time that class runs dry; a
/// slice given back goes to its class's free list (no coalescing), so
/// taking and giving back are O(1).
struct ArenaConfig {
  std::size_t min_slice = 256;
  std::size_t max_slice = 64 * 1024;
  /// `Access::local` (the default) for destinations of gets and sources of
  /// puts. An arena registered for remote access exposes all of itself to
  /// every peer that holds its key, whichever slice that key came with.
  Access access = Access::local;
};

struct ArenaStats {
  std::uint64_t capacity_bytes = 0;   ///< the arena's memory (whole chunks)
  std::uint64_t allocated_bytes = 0;  ///< in slices handed out, by their class's size
  std::uint64_t slices = 0;           ///< handed out and not yet back
  std::uint64_t waiting = 0;          ///< async_allocate calls waiting for room
  std::uint64_t allocations = 0;      ///< slices handed out, ever
  std::uint64_t refused = 0;          ///< allocate() calls answered budget_exceeded
};

/// Move-only handle to an arena. Destroying it answers the async_allocate
/// calls still waiting (`shutting_down`); the slices handed out stay valid,
/// and the registration goes once the last of them is back.
class Arena {
 public:
  Arena() noexcept;
  Arena(Arena&&) noexcept;
  Arena& operator=(Arena&&) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  [[nodiscard]] explicit operator bool() const noexcept { return core_ != nullptr; }

  /// A slice of `bytes` (its guard's size() is exactly that), or
  /// `budget_exceeded` when the arena has no room, `out_of_range` for 0 or
  /// more than max_slice.
  [[nodiscard]] Result<RegionGuard> allocate(std::size_t bytes);

  /// Like allocate(), but waits for room instead of refusing; any
  /// cancellation answers `cancelled` at once.
  template <asio::completion_token_for<void(Result<RegionGuard>)> Token>
  auto async_allocate(std::size_t bytes, Token&& token) {
    return asio::async_initiate<Token, void(Result<RegionGuard>)>(
        [core = core_](auto handler, std::size_t b) { do_allocate(core, b, std::move(handler)); }, token, bytes);
  }

  [[nodiscard]] ArenaStats stats() const;
  /// The arena's whole registration (a slice's backend_region()).
  [[nodiscard]] const BackendRegion& backend_region() const noexcept;

 private:
  friend class Registry;
  explicit Arena(std::shared_ptr<detail::ArenaCore> core) noexcept;
  static void do_allocate(const std::shared_ptr<detail::ArenaCore>& core, std::size_t bytes,
                          asio::any_completion_handler<void(Result<RegionGuard>)> handler);

  std::shared_ptr<detail::ArenaCore> core_;
};

}  // namespace corma
