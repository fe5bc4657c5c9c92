// RegionGuard: the RAII owner of one registration handed out by a Registry.
#pragma once

#include <corma/backend.hpp>
#include <corma/error.hpp>
#include <corma/detail/answer_without_object.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace corma {

namespace detail {
class ArenaCore;
class GuardShare;
class Latch;
class RegionState;
class RegistrationCache;
class RegistryCore;
}  // namespace detail

/// Everything a peer needs to address a registered region: what the
/// rendezvous descriptor carries on the wire.
struct RemoteRegion {
  BackendId backend{};          ///< the owner backend's wire_id()
  std::uint64_t generation = 0; ///< the owner registry's registration number
  std::uint64_t addr = 0;       ///< the address that was registered
  std::uint64_t len = 0;        ///< the bytes that were registered
  PackedKey packed_key;

  friend bool operator==(const RemoteRegion&, const RemoteRegion&) = default;
};

/// Which bytes a transfer moves: `len` bytes between `local_offset` in the
/// guard's region and `remote_offset` in the remote region.
struct TransferRange {
  std::uint64_t local_offset = 0;
  std::uint64_t remote_offset = 0;
  std::uint64_t len = 0;  ///< bytes; of each block when strided
  /// Strided, as TransferRequest: `blocks` blocks of `len` bytes, block i at
  /// `local_offset + i * local_stride` and `remote_offset + i * remote_stride`.
  std::uint64_t blocks = 1;
  std::uint64_t local_stride = 0;
  std::uint64_t remote_stride = 0;
};

class RegionGuard;

/// One element of RegionGuard::async_get_batch: `range.len` bytes of
/// `remote` (at `range.remote_offset`) into `into` (at `range.local_offset`).
/// With an imported key (RdmaBackend::async_import_key) the remote region's
/// packed key may be left empty.
struct BatchedGet {
  RegionGuard* into = nullptr;
  RemoteRegion remote;
  TransferRange range;
  RemoteKeyId key = RemoteKeyId::none;
};

/// Resolves exactly when a region's memory may be freed or reused. Copyable,
/// and outlives the guard it came from.
class DeregisteredEvent {
 public:
  [[nodiscard]] bool is_set() const;

  /// The operation holds the event's state, not the event: a deferred wait
  /// may be launched after the (often temporary) event is gone.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_wait(Token&& token) const {
    return asio::async_initiate<Token, void(Result<void>)>(
        [latch = latch_](auto handler) { do_wait(latch, std::move(handler)); }, token);
  }

 private:
  friend class RegionGuard;
  explicit DeregisteredEvent(std::shared_ptr<detail::Latch> latch) : latch_(std::move(latch)) {}
  static void do_wait(const std::shared_ptr<detail::Latch>& latch,
                      asio::any_completion_handler<void(Result<void>)> handler);

  std::shared_ptr<detail::Latch> latch_;
};

/// Move-only owner of one registration, or of one slice of an arena's
/// registration (Arena::allocate). Destroying it never blocks: it starts
/// deregistration in the background (on the backend's thread), and the budget
/// comes back when the backend confirms the unmap; a slice goes back to its
/// arena once its transfers have ended. Its operations hold the region's
/// state, not the guard: one created with `asio::deferred` acts on the region
/// the guard held then, even if the guard has moved or gone by the time it is
/// launched.
class RegionGuard {
 public:
  RegionGuard() noexcept;
  RegionGuard(RegionGuard&& other) noexcept;
  RegionGuard& operator=(RegionGuard&& other) noexcept;
  RegionGuard(const RegionGuard&) = delete;
  RegionGuard& operator=(const RegionGuard&) = delete;
  ~RegionGuard();

  [[nodiscard]] explicit operator bool() const noexcept { return state_ != nullptr; }

  /// The local view: exactly the bytes that were registered, or the slice's.
  [[nodiscard]] std::byte* data() const noexcept;
  [[nodiscard]] std::size_t size() const noexcept;
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data(), size()}; }

  /// The registration's id (a slice's is its arena's).
  [[nodiscard]] RegionId id() const noexcept;
  /// Bytes charged against the budget (whole pages); 0 for a slice, whose
  /// arena was charged once for all of them.
  [[nodiscard]] std::uint64_t charged_bytes() const noexcept;
  /// What the backend reported, including the effective (page-rounded)
  /// range; a slice's is its arena's whole registration.
  [[nodiscard]] const BackendRegion& backend_region() const noexcept;
  /// What a peer needs to get from (or put into) this region: for a slice,
  /// the slice's bytes only. Its key is the registration's: a peer holding
  /// it can reach the whole registration (for a slice, its whole arena).
  [[nodiscard]] RemoteRegion remote() const;
  /// Resolves when the memory may be freed or reused; for a slice, when the
  /// slice is back in its arena (the guard and its transfers are done).
  [[nodiscard]] DeregisteredEvent deregistered() const;

  /// Reads `range.len` bytes of `remote` (at `range.remote_offset`) into this
  /// region at `range.local_offset`. Refused with `region_not_found` once the
  /// region is being deregistered. Only a `terminal` cancellation answers
  /// early, with `cancelled` (the bytes may still land; the region stays
  /// registered until the transfer really ends); `partial` and `total` are
  /// not honoured. The same goes for async_put.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_get(PeerId peer, const RemoteRegion& remote, TransferRange range, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [state = state_, share = share_](auto handler, PeerId p, RemoteRegion rr, TransferRange r) mutable {
          do_transfer(std::move(state), std::move(share), false, p, std::move(rr), r, std::move(handler));
        },
        token, peer, remote, range);
  }

  /// Writes `range.len` bytes of this region (at `range.local_offset`) into
  /// `remote` at `range.remote_offset`.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_put(PeerId peer, const RemoteRegion& remote, TransferRange range, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [state = state_, share = share_](auto handler, PeerId p, RemoteRegion rr, TransferRange r) mutable {
          do_transfer(std::move(state), std::move(share), true, p, std::move(rr), r, std::move(handler));
        },
        token, peer, remote, range);
  }

  /// Many gets from one peer, submitted as one backend batch and answered
  /// once, element by element (BatchOutcome). Each element is checked as
  /// async_get checks a single get; one that fails its checks is a failure
  /// of its own and never reaches the backend. Every destination region
  /// stays registered until the batch has ended. Cancellation as async_get.
  template <asio::completion_token_for<void(Result<BatchOutcome>)> Token>
  static auto async_get_batch(PeerId peer, std::vector<BatchedGet> gets, Token&& token) {
    return asio::async_initiate<Token, void(Result<BatchOutcome>)>(
        [](auto handler, PeerId p, std::vector<BatchedGet> g) {
          // An empty batch names no backend to answer through: answered
          // here, posted to the handler's own executor (never inside this
          // call, wherever it runs, the backend's progress thread included)
          // while its full type is known.
          if (g.empty()) {
            return detail::answer_without_object(std::move(handler), Result<BatchOutcome>(BatchOutcome{0, {}}));
          }
          do_get_batch(p, std::move(g), std::move(handler));
        },
        token, peer, std::move(gets));
  }

  /// Stops new transfers, waits for the ones in flight, unmaps. Success means
  /// the backend confirmed the release; an error means the state is unknown
  /// and the budget stays charged. A slice's guard lets go of the slice and
  /// answers once it is back in its arena.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_deregister(Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [state = state_, share = share_](auto handler) { do_deregister(state, share, std::move(handler)); },
        token);
  }

 private:
  friend class detail::RegistryCore;
  friend class detail::ArenaCore;
  friend class detail::RegistrationCache;
  explicit RegionGuard(std::shared_ptr<detail::RegionState> state) noexcept;
  RegionGuard(std::shared_ptr<detail::RegionState> state, std::shared_ptr<detail::GuardShare> share) noexcept;

  static void do_transfer(std::shared_ptr<detail::RegionState> state, std::shared_ptr<detail::GuardShare> share,
                          bool is_put, PeerId peer, RemoteRegion remote, TransferRange range,
                          asio::any_completion_handler<void(Result<void>)> handler);
  static void do_get_batch(PeerId peer, std::vector<BatchedGet> gets,
                           asio::any_completion_handler<void(Result<BatchOutcome>)> handler);
  static void do_deregister(const std::shared_ptr<detail::RegionState>& state,
                            const std::shared_ptr<detail::GuardShare>& share,
                            asio::any_completion_handler<void(Result<void>)> handler);
  void release() noexcept;

  std::shared_ptr<detail::RegionState> state_;
  std::shared_ptr<detail::GuardShare> share_;  ///< set for a slice: its place in the registration
};

}  // namespace corma
