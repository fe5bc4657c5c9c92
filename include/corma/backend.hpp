// RdmaBackend: the seam between corma's registry/rendezvous layers and a
// provider (UCX, verbs, or the in-process test backend). Nothing
// provider-specific crosses it.
#pragma once

#include <corma/error.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>
#include <vector>

namespace corma {

namespace asio = boost::asio;

/// A registration, as the backend names it.
enum class RegionId : std::uint64_t {};
/// A connected (or half-connected) peer, as the backend names it.
enum class PeerId : std::uint64_t {};
/// A peer's packed key imported once (RdmaBackend::async_import_key); `none`
/// means a transfer carries its packed key itself.
enum class RemoteKeyId : std::uint64_t { none = 0 };

/// Names a backend's records on the wire (descriptors, the rendezvous hello).
/// Each backend owns its value (corma::ucx::backend_id, corma::verbs::
/// backend_id); the core names no provider. 0 means "no backend".
enum class BackendId : std::uint8_t { none = 0 };

/// What peers may do with a registered region. Local access (the region as
/// the destination of a get or the source of a put) is always granted.
enum class Access : std::uint8_t {
  local = 0,              ///< not exposed to peers
  remote_read = 1,        ///< peers may get from it
  remote_read_write = 3,  ///< peers may get from and put into it
  /// peers may also apply atomics (RdmaBackend::async_atomic) to its
  /// 8-byte-aligned words
  remote_atomic = 7,
};

/// Whether a region registered with `granted` allows what `wanted` asks.
[[nodiscard]] constexpr bool access_allows(Access granted, Access wanted) noexcept {
  const auto have = static_cast<unsigned>(granted);
  const auto want = static_cast<unsigned>(wanted);
  return (have & want) == want;
}

/// Opaque bytes a peer needs to reach a region (a UCX rkey buffer, a verbs
/// rkey record...). Only the backend that produced them can interpret them.
using PackedKey = std::vector<std::byte>;

/// Packed keys longer than this are refused without being looked at.
inline constexpr std::size_t max_packed_key_size = 4096;

/// Keys one peer may have imported at once; beyond it an import answers
/// `budget_exceeded` until keys are released.
inline constexpr std::size_t max_imported_keys_per_peer = 65536;

/// Peer set-up blobs (worker addresses, queue-pair attributes) longer than
/// this are refused without being looked at.
inline constexpr std::size_t max_peer_blob_size = 64 * 1024;

/// The result of a map. `effective_addr/len` may be wider than the request
/// (page rounding): report them, never compute offsets from them.
struct BackendRegion {
  RegionId id{};
  std::uint64_t effective_addr = 0;
  std::uint64_t effective_len = 0;
  PackedKey packed_key;
};

/// How a transfer names the peer's memory: by the key the peer's backend
/// packed for it, or by a key imported for that peer once
/// (RdmaBackend::async_import_key), which costs no unpacking per transfer.
using TransferKey = std::variant<PackedKey, RemoteKeyId>;

/// One one-sided transfer between a local region and a peer's memory.
/// get: `len` bytes at the peer's `remote_addr` land in the local region at
/// `local_offset`. put: the mirror image.
///
/// Strided (`blocks` > 1): `blocks` blocks of `len` bytes each, block i
/// between `local_offset + i * local_stride` and `remote_addr + i *
/// remote_stride` (a KV cache's layers x blocks). It is checked once, as a
/// whole (first and last block in bounds, no overflow, strides of at least
/// `len` so that no two blocks overlap), and succeeds or fails as one
/// transfer.
struct TransferRequest {
  PeerId peer{};
  RegionId local{};
  std::uint64_t local_offset = 0;
  std::uint64_t remote_addr = 0;
  std::uint64_t len = 0;  ///< bytes; of each block when strided
  TransferKey key;
  std::uint64_t blocks = 1;
  std::uint64_t local_stride = 0;
  std::uint64_t remote_stride = 0;

  /// Where block `i` starts, on each side.
  [[nodiscard]] constexpr std::uint64_t local_offset_of(std::uint64_t i) const noexcept {
    return local_offset + i * local_stride;
  }
  [[nodiscard]] constexpr std::uint64_t remote_addr_of(std::uint64_t i) const noexcept {
    return remote_addr + i * remote_stride;
  }
};

/// Blocks one strided transfer may move; more are refused (`out_of_range`).
inline constexpr std::uint64_t max_transfer_blocks = 1 << 20;
using GetRequest = TransferRequest;
using PutRequest = TransferRequest;

/// Many transfers of one kind (all gets or all puts), submitted at once and
/// answered at once. Elements may name different peers and regions.
using TransferBatch = std::vector<TransferRequest>;

/// A notification that ends a batch of puts (RdmaBackend::async_put_batch):
/// "these blocks have landed". It goes to `peer` once every put of the batch
/// has been issued, so it arrives after every one of them to `peer` is
/// visible there, as async_notify after them would.
struct BatchNotification {
  PeerId peer{};
  std::uint64_t tag = 0;
};

/// Batches longer than this are refused whole (`out_of_range`) without any
/// element being looked at.
inline constexpr std::size_t max_batch_size = 16384;

/// One element of a batch that did not succeed: its index in the batch and
/// the error it would have had as a single transfer.
struct BatchFailure {
  std::size_t index = 0;
  Error error;
};

/// How a batch that ran went, element by element: every element not listed
/// in `failures` succeeded.
struct BatchOutcome {
  std::size_t size = 0;                ///< elements in the batch
  std::vector<BatchFailure> failures;  ///< in index order
  [[nodiscard]] bool all_succeeded() const noexcept { return failures.empty(); }
};

/// A 64-bit atomic on a peer's word. Every one answers the word's value
/// before it (for `add`, which fetches nothing, 0).
enum class AtomicOp : std::uint8_t {
  add,           ///< word += operand
  fetch_add,     ///< word += operand
  compare_swap,  ///< word = operand if word == compare
  swap,          ///< word = operand
};

/// One atomic on the 8-byte-aligned word at the peer's `remote_addr`, inside
/// a region the peer registered with Access::remote_atomic. Atomics are
/// atomic with respect to each other on that word (and to the provider's own
/// transfers where it says so: docs/backends.md), in the word's host order.
struct AtomicRequest {
  PeerId peer{};
  AtomicOp op = AtomicOp::fetch_add;
  std::uint64_t remote_addr = 0;
  std::uint64_t operand = 0;  ///< added, or stored
  std::uint64_t compare = 0;  ///< compare_swap only
  TransferKey key;
};

/// The size and alignment of an atomic's word.
inline constexpr std::uint64_t atomic_word_size = 8;

/// A notification a peer sent (RdmaBackend::async_notify), received by the
/// target after every put that peer issued before it is visible.
struct Notification {
  PeerId peer{};  ///< the target's name for the peer that sent it
  std::uint64_t tag = 0;
};

/// Notifications a backend keeps for async_receive_notification at once;
/// beyond it a sender's async_notify answers `budget_exceeded` (the
/// notification is not delivered, never silently dropped).
inline constexpr std::size_t notification_queue_capacity = 4096;

/// The initiator's half of peer set-up: a pending peer and the bytes to send.
struct PeerOffer {
  PeerId peer{};
  std::vector<std::byte> blob;
};

/// The target's half of peer set-up: its new peer and the bytes to send back.
struct PeerAnswer {
  PeerId peer{};
  std::vector<std::byte> blob;
};

/// An asynchronous RDMA provider. Every public operation is an Asio
/// initiating function (any completion token) completing with a Result;
/// see docs/architecture.md for the contract every implementation honours.
/// Like an Asio I/O object (it is neither copied nor moved, and lives behind
/// a shared_ptr), it must outlive the launch of its operations: one created
/// with `asio::deferred` refers to the backend, not to shared state.
class RdmaBackend {
 public:
  template <class T>
  using Handler = asio::any_completion_handler<void(Result<T>)>;

  RdmaBackend() = default;
  RdmaBackend(const RdmaBackend&) = delete;
  RdmaBackend& operator=(const RdmaBackend&) = delete;
  virtual ~RdmaBackend() = default;

  /// A short name for humans and logs: "ucx", "verbs"...
  [[nodiscard]] virtual std::string_view key() const noexcept = 0;

  /// What names this backend's descriptors and peer offers on the wire.
  [[nodiscard]] virtual BackendId wire_id() const noexcept = 0;

  /// The executor of the backend's progress thread. Work spawned on it runs
  /// on that thread: transfers started there complete inline, with no
  /// hand-off between threads at all, and what it posts back to this
  /// executor (post, co_spawn, awaitable operators) runs there too. Timers
  /// made from it are served by that thread. Nothing may block there, since
  /// every operation of the backend waits behind it (docs/architecture.md,
  /// "Threading model").
  [[nodiscard]] virtual asio::any_io_executor progress_executor() const = 0;

  /// Registrations the provider still holds, counted on confirmed
  /// deregistration; nullopt when the backend cannot tell.
  [[nodiscard]] virtual std::optional<std::size_t> live_registrations() const = 0;

  /// Registers [ptr, ptr + len) and packs a remote key for it. Any
  /// cancellation type is honoured: a cancelled map leaves nothing behind.
  template <asio::completion_token_for<void(Result<BackendRegion>)> Token>
  auto async_map(void* ptr, std::size_t len, Access access, Token&& token) {
    return asio::async_initiate<Token, void(Result<BackendRegion>)>(
        [this](auto handler, void* p, std::size_t n, Access a) {
          do_map(p, n, a, std::move(handler));
        },
        token, ptr, len, access);
  }

  /// Deregisters; idempotent. Success means no longer registered; any error
  /// means unknown. It proceeds once submitted: only a `terminal`
  /// cancellation is honoured, and abandons just the answer.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_unmap(RegionId id, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, RegionId r) { do_unmap(r, std::move(handler)); }, token, id);
  }

  /// A get, then a put. Only a `terminal` cancellation is honoured: it
  /// answers `cancelled` at once while the bytes may still land, and the
  /// local region stays registered until the transfer really ends.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_get(GetRequest request, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, GetRequest r) { do_get(std::move(r), std::move(handler)); }, token,
        std::move(request));
  }

  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_put(PutRequest request, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, PutRequest r) { do_put(std::move(r), std::move(handler)); }, token,
        std::move(request));
  }

  /// Many gets (or puts) in one submission with one completion. Every
  /// element is checked as a single transfer would be before any is posted:
  /// one that fails a check is reported in the outcome (index and error),
  /// never reaches the provider, and fails none of the others. The rest may
  /// run as one transfer per peer (docs/architecture.md, "Batches"): an
  /// element reported with a failure that came after posting (the peer lost,
  /// the deadline passed, the backend shut down, cancelled) may or may not
  /// have landed; one not reported failed has landed. The batch as a whole
  /// fails only when it never ran: too long (`out_of_range`), the backend
  /// shut down or its queue full. A `terminal` cancellation answers at once,
  /// with the elements still running listed as `cancelled` (their bytes may
  /// still land; their local regions stay registered until they really
  /// end); other types are not honoured. An empty batch succeeds with
  /// nothing to do.
  template <asio::completion_token_for<void(Result<BatchOutcome>)> Token>
  auto async_get_batch(TransferBatch batch, Token&& token) {
    return asio::async_initiate<Token, void(Result<BatchOutcome>)>(
        [this](auto handler, TransferBatch b) { do_get_batch(std::move(b), std::move(handler)); }, token,
        std::move(batch));
  }

  template <asio::completion_token_for<void(Result<BatchOutcome>)> Token>
  auto async_put_batch(TransferBatch batch, Token&& token) {
    return asio::async_initiate<Token, void(Result<BatchOutcome>)>(
        [this](auto handler, TransferBatch b) { do_put_batch(std::move(b), std::nullopt, std::move(handler)); },
        token, std::move(batch));
  }

  /// The same puts, ended by `notification` (BatchNotification): one more
  /// element, at index batch.size() of the outcome, answered as async_notify
  /// would be. When a put of the batch to the notification's peer fails
  /// before it is issued, the notification is not sent: its element fails
  /// with that put's error. (A put that fails once issued fails the
  /// connection, and the notification behind it with it.)
  template <asio::completion_token_for<void(Result<BatchOutcome>)> Token>
  auto async_put_batch(TransferBatch batch, BatchNotification notification, Token&& token) {
    return asio::async_initiate<Token, void(Result<BatchOutcome>)>(
        [this](auto handler, TransferBatch b, BatchNotification n) {
          do_put_batch(std::move(b), n, std::move(handler));
        },
        token, std::move(batch), notification);
  }

  /// A 64-bit atomic on a peer's word (AtomicRequest), answered with the
  /// word's old value. Refused before the provider sees it: a misaligned
  /// word (`out_of_range`), a word outside the key's region
  /// (`out_of_range`), a region without Access::remote_atomic
  /// (`not_owned`). A provider without atomics answers `not_configured`.
  /// Only a `terminal` cancellation is honoured: the atomic may still apply.
  template <asio::completion_token_for<void(Result<std::uint64_t>)> Token>
  auto async_atomic(AtomicRequest request, Token&& token) {
    return asio::async_initiate<Token, void(Result<std::uint64_t>)>(
        [this](auto handler, AtomicRequest r) { do_atomic(std::move(r), std::move(handler)); }, token,
        std::move(request));
  }

  /// Completes once every put to `peer` issued before it is complete at the
  /// target (its bytes are there for the target to read). Answered on peer
  /// loss and shutdown like a transfer; only a `terminal` cancellation is
  /// honoured (the flush goes on, unanswered).
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_flush(PeerId peer, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, PeerId p) { do_flush(p, std::move(handler)); }, token, peer);
  }

  /// Sends `tag` to `peer`, delivered after every put to that peer issued
  /// before it is visible there. Answered once the target has queued it;
  /// `budget_exceeded` when the target's queue is full, and
  /// `peer_unreachable` when the target does not accept notifications from
  /// this side (it drops and counts them: refused_notifications()). Only a
  /// `terminal` cancellation is honoured: the notification may still arrive.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_notify(PeerId peer, std::uint64_t tag, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, PeerId p, std::uint64_t t) { do_notify(p, t, std::move(handler)); }, token, peer, tag);
  }

  /// The next notification from a peer this side accepted, oldest first.
  /// Any cancellation type is honoured: a cancelled receive takes nothing.
  /// `shutting_down` once the backend shuts down.
  template <asio::completion_token_for<void(Result<Notification>)> Token>
  auto async_receive_notification(Token&& token) {
    return asio::async_initiate<Token, void(Result<Notification>)>(
        [this](auto handler) { do_receive_notification(std::move(handler)); }, token);
  }

  /// Notifications that arrived from peers this side never accepted
  /// (dropped), so far.
  [[nodiscard]] virtual std::uint64_t refused_notifications() const = 0;

  /// Imports a peer's packed key: checked and unpacked once (`invalid_key`,
  /// `peer_unreachable` as a transfer would be answered), then named by
  /// transfers to that peer instead of their packed bytes. A key lives until
  /// it is released or its peer closes.
  template <asio::completion_token_for<void(Result<RemoteKeyId>)> Token>
  auto async_import_key(PeerId peer, PackedKey packed_key, Token&& token) {
    return asio::async_initiate<Token, void(Result<RemoteKeyId>)>(
        [this](auto handler, PeerId p, PackedKey k) { do_import_key(p, std::move(k), std::move(handler)); },
        token, peer, std::move(packed_key));
  }

  /// Releases an imported key; idempotent. Transfers admitted before go on
  /// with it; later ones naming it are refused (`invalid_key`).
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_release_key(RemoteKeyId key, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, RemoteKeyId k) { do_release_key(k, std::move(handler)); }, token, key);
  }

  /// Initiator — the side that gets from and puts to the target: creates a
  /// pending peer and the offer to send to the target.
  template <asio::completion_token_for<void(Result<PeerOffer>)> Token>
  auto async_peer_offer(Token&& token) {
    return asio::async_initiate<Token, void(Result<PeerOffer>)>(
        [this](auto handler) { do_peer_offer(std::move(handler)); }, token);
  }

  /// Target: accepts an offer, creating its peer and the answer to send back.
  /// The offer comes from the network: the backend checks every byte of it
  /// (`protocol` otherwise). Transfers go from the initiator; a backend may
  /// refuse transfers from the target towards the peer (`not_configured`).
  template <asio::completion_token_for<void(Result<PeerAnswer>)> Token>
  auto async_peer_accept(std::vector<std::byte> offer, Token&& token) {
    return asio::async_initiate<Token, void(Result<PeerAnswer>)>(
        [this](auto handler, std::vector<std::byte> o) {
          do_peer_accept(std::move(o), std::move(handler));
        },
        token, std::move(offer));
  }

  /// Initiator: completes the pending peer with the target's answer.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_peer_complete(PeerId peer, std::vector<std::byte> answer, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, PeerId p, std::vector<std::byte> a) {
          do_peer_complete(p, std::move(a), std::move(handler));
        },
        token, peer, std::move(answer));
  }

  /// Disconnects a peer; transfers to it fail afterwards. Idempotent.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_peer_close(PeerId peer, Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler, PeerId p) { do_peer_close(p, std::move(handler)); }, token, peer);
  }

  /// Orderly teardown: refuses new work, answers every caller, unmaps what is
  /// left. Afterwards live_registrations() is 0.
  template <asio::completion_token_for<void(Result<void>)> Token>
  auto async_shutdown(Token&& token) {
    return asio::async_initiate<Token, void(Result<void>)>(
        [this](auto handler) { do_shutdown(std::move(handler)); }, token);
  }

 protected:
  virtual void do_map(void* ptr, std::size_t len, Access access, Handler<BackendRegion> h) = 0;
  virtual void do_unmap(RegionId id, Handler<void> h) = 0;
  virtual void do_get(GetRequest request, Handler<void> h) = 0;
  virtual void do_put(PutRequest request, Handler<void> h) = 0;
  virtual void do_get_batch(TransferBatch batch, Handler<BatchOutcome> h) = 0;
  virtual void do_put_batch(TransferBatch batch, std::optional<BatchNotification> notification,
                            Handler<BatchOutcome> h) = 0;
  virtual void do_atomic(AtomicRequest request, Handler<std::uint64_t> h) = 0;
  virtual void do_flush(PeerId peer, Handler<void> h) = 0;
  virtual void do_notify(PeerId peer, std::uint64_t tag, Handler<void> h) = 0;
  virtual void do_receive_notification(Handler<Notification> h) = 0;
  virtual void do_import_key(PeerId peer, PackedKey packed_key, Handler<RemoteKeyId> h) = 0;
  virtual void do_release_key(RemoteKeyId key, Handler<void> h) = 0;
  virtual void do_peer_offer(Handler<PeerOffer> h) = 0;
  virtual void do_peer_accept(std::vector<std::byte> offer, Handler<PeerAnswer> h) = 0;
  virtual void do_peer_complete(PeerId peer, std::vector<std::byte> answer, Handler<void> h) = 0;
  virtual void do_peer_close(PeerId peer, Handler<void> h) = 0;
  virtual void do_shutdown(Handler<void> h) = 0;
};

/// Checks a local range before anything reaches a provider: non-null,
/// non-empty, and `ptr + len` not wrapping around.
[[nodiscard]] Result<void> validate_range(const void* ptr, std::size_t len);

/// Checks an atomic's word against the region a key names, before any
/// provider sees it: 8-byte aligned (`out_of_range`), inside
/// [region_addr, region_addr + region_len) (`out_of_range`), the region
/// registered with Access::remote_atomic (`not_owned`).
[[nodiscard]] Result<void> validate_atomic_word(std::uint64_t remote_addr, std::uint64_t region_addr,
                                                std::uint64_t region_len, Access region_access);

/// Checks a get's or put's local side against its region of `region_len`
/// bytes, before any provider sees it (`out_of_range`): not empty, its
/// blocks (TransferRequest) well formed, every block inside the region.
[[nodiscard]] Result<void> validate_local_range(const TransferRequest& request, std::uint64_t region_len);

/// Checks a get's or put's remote side against the region its key names,
/// before any provider sees it: every block inside [key_addr, key_addr +
/// key_len) (`out_of_range`), and for a put, a region registered with
/// remote write (`not_owned`). validate_local_range checked the blocks.
[[nodiscard]] Result<void> validate_remote_range(bool is_put, const TransferRequest& request,
                                                 std::uint64_t key_addr, std::uint64_t key_len, Access key_access);

/// Checks a batch's length against max_batch_size.
[[nodiscard]] Result<void> validate_batch_size(std::size_t size);

/// Checks that [offset, offset + len) lies inside a region of `region_len`
/// bytes, without overflowing.
[[nodiscard]] Result<void> validate_slice(std::uint64_t offset, std::uint64_t len,
                                          std::uint64_t region_len);

}  // namespace corma
