// Consumer: the embeddable side of the rendezvous that fetches objects from
// an Owner, over RDMA into its own registered memory when it can, and in
// chunks when it cannot.
#pragma once

#include <corma/detail/as_operation.hpp>
#include <corma/error.hpp>
#include <corma/owned_buffer.hpp>
#include <corma/region_guard.hpp>
#include <corma/registry.hpp>
#include <corma/rendezvous.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace corma {

struct ConsumerConfig {
  /// How long the owner may stay silent while a request waits for its
  /// answer (and how long a frame's write may take); past it the connection
  /// is given up with `timeout`. Half way through a silence a heartbeat
  /// (version 4) asks whether the owner lives, so an answer that is merely
  /// slow (an acquire behind a large registration) is waited for while the
  /// owner answers anything; cancel the operation to bound it.
  std::chrono::milliseconds io_timeout{10000};
  /// Offer RDMA to the owner when a registry (and so a backend) is given.
  bool use_rdma = true;
  /// Chunked reads keep this many chunks' worth of pulls on the wire at
  /// once (at least 1), so the owner's reads, the network and the copies
  /// here overlap. The window is bytes: with the owner's 1 MiB chunks, 8 MiB
  /// (a 1 Gbit/s path with a 64 ms round trip, or 10 Gbit/s at 6.4 ms), and
  /// a set of objects smaller than a chunk (async_fetch_many) keeps as many
  /// bytes in flight in more, smaller pulls.
  std::uint32_t pull_window = 8;
  /// Fetches (of any kind) running at once on the connection, RDMA
  /// transfers included; more wait their turn, in order. At least 1.
  std::size_t max_fetches_in_flight = 16;
  /// The rendezvous protocol version offered in the hello: 6 (the owner
  /// can prove who it is; from 5 it says which version of an object each
  /// fetch read) by default; an older
  /// owner answers with its own, and then FetchOutcome::generation stays
  /// empty and a byte range lent in windows steps through the windows before
  /// it (version 4), each lease is renewed by a frame of its own (version
  /// 3), async_push_fetch reads instead (version 2) and async_fetch_many
  /// fetches one object at a time (version 1).
  std::uint16_t protocol_version = rendezvous_protocol_version;
  /// The cluster's shared key (at least 16 bytes; empty: none). With a key,
  /// the owner must prove it holds it before the hello (version 6): the
  /// consumer sends a fresh challenge and checks the owner's HMAC, and only
  /// then makes its RDMA offer. An owner that cannot prove it (no key,
  /// another key, an older version, another id than `expected_owner`) is
  /// refused with `not_owned` and sees no offer and no push key.
  std::string cluster_key{};
  /// The owner id the proof must name (a directory's entry); empty: any id.
  std::string expected_owner{};
  /// Remote keys async_fetch_many keeps imported for the owner's exports
  /// (each imported once, then reused by every set that reads that export);
  /// past it the keys no read is using are let go. At least 1.
  std::size_t max_imported_keys = 4096;
  /// Called on the consumer's executor as bytes arrive (after each chunk,
  /// and once when an RDMA transfer completes).
  std::function<void(std::uint64_t done, std::uint64_t total)> on_progress;
};

/// Part of an object: `length` bytes from `offset`, or every byte from
/// `offset` on when no length is given; the default is the whole object. A
/// range that does not lie within the object is refused (`out_of_range`)
/// once the owner has said the object's size, its lease released.
struct ByteRange {
  std::uint64_t offset = 0;
  std::optional<std::uint64_t> length{};
};

/// How a fetch went: the object's size, the part of it fetched, the version
/// read, the path its bytes took, and why when it was not RDMA.
struct FetchOutcome {
  /// The whole object's size.
  std::uint64_t size = 0;
  /// The bytes fetched: [offset, offset + length) of the object (0 and
  /// `size` for a whole object).
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  /// Which version of the object was read: a number the owner gives each
  /// publication of a name and each version of it its resolver finds (for
  /// corma serve, each version of a file). Two fetches of one name with the
  /// same generation read the same bytes. Empty when the owner speaks a
  /// protocol older than version 5.
  std::optional<std::uint64_t> generation;
  Path path = Path::chunked;
  /// Why it came in chunks (empty when it came over RDMA).
  std::optional<ChunkedReason> reason;
  /// With rdma_failed: how the RDMA read failed.
  std::string failure;
  /// RDMA was granted but failed; the chunked path finished the job.
  [[nodiscard]] bool fell_back() const noexcept { return reason == ChunkedReason::rdma_failed; }
  /// The reason in words: empty over RDMA, "no_offer", "rdma_failed: ...".
  [[nodiscard]] std::string reason_text() const;
  /// Windows read, when the owner lent the object in windows (larger than
  /// its budget holds); 0 when it was lent whole or sent in chunks.
  std::uint32_t windows = 0;
  /// async_push_fetch: the owner wrote the object into the landing (path
  /// rdma). False when the push was refused and the object was read
  /// instead; `push_refusal` then says why.
  bool pushed = false;
  std::string push_refusal;
};

/// How async_push_fetch asks for an object.
struct PushOptions {
  /// Where in the landing region the object goes.
  std::uint64_t offset = 0;
  /// The owner also sends this tag as a notification (RdmaBackend::
  /// async_receive_notification on this side's backend) once the bytes are
  /// in place: for another part of this program that waits for them. It is
  /// not sent when the push is refused and the object read instead.
  std::optional<std::uint64_t> notify_tag;
};

/// Receives a fetched object's bytes in order: `bytes` belong at `offset`
/// of the object (of the whole object, also when a byte range of it is
/// fetched) and are only valid during the call. An error ends the fetch
/// with that error.
using ChunkSink = std::function<Result<void>(std::uint64_t offset, std::span<const std::byte> bytes)>;

/// The completion of an AsyncChunkSink's write.
using ChunkWritten = boost::asio::any_completion_handler<void(Result<void>)>;

/// Receives a fetched object's bytes like a ChunkSink, without holding up
/// the consumer's loop (a file written on a thread of its own): it
/// completes `done` exactly once, from any thread, when it is finished with
/// `bytes`, which stay valid and untouched until then. Chunks are handed
/// over in order; while the sink writes one, the fetch goes on reading the
/// next, with up to two chunks held by the sink at once.
/// An error ends the fetch with that error. A fetch completes only once the
/// sink has answered for every chunk it was handed, cancelled or not, so
/// that its caller may close what the sink writes to.
using AsyncChunkSink = std::function<void(std::uint64_t offset, std::span<const std::byte> bytes, ChunkWritten done)>;

/// `write` run on `executor` (a thread pool of file threads, say) instead of
/// the consumer's loop: the asynchronous sink most programs want.
[[nodiscard]] AsyncChunkSink sink_on(boost::asio::any_io_executor executor, ChunkSink write);

/// Memory an RDMA read may land in for good (see StreamDestination):
/// `memory`, at least the object's size, stays valid while `keepalive` is
/// held, and the consumer holds it until the memory's registration is gone.
struct Landing {
  std::span<std::byte> memory;
  std::shared_ptr<const void> keepalive;
};
/// Given an object's size, where its RDMA read lands, or why it cannot.
using LandingFor = std::function<Result<Landing>(std::uint64_t size)>;

/// Where async_fetch_to puts an object: chunks (of a chunked fetch, or of
/// the fallback after a failed RDMA read) go to `sink` as they arrive. An
/// object read over RDMA (whole or in windows) lands in
/// `rdma_landing(size)`'s memory and stays there, the sink not called for
/// it: a file's shared mapping, say, so that the bytes reach the file with
/// no copy. Without `rdma_landing` it lands in fresh memory handed to the
/// sink (whole, or window by window).
struct StreamDestination {
  ChunkSink sink;
  LandingFor rdma_landing;
  /// Takes `sink`'s place when it is set: the bytes are handed over and the
  /// fetch goes on while they are written.
  AsyncChunkSink async_sink = {};
  /// A chunked fetch lands in `rdma_landing`'s memory too, each chunk read
  /// there straight from the socket (no copy of corma's); the sink then
  /// serves only the fallback after a failed RDMA read. Needs
  /// `rdma_landing`. Meant for memory: for a fresh shared mapping of a
  /// file, a write fault per page costs more than a `pwrite` from the sink.
  bool chunks_to_landing = false;
};

/// A fetched object in a buffer of the consumer's own.
struct Fetched : FetchOutcome {
  OwnedBuffer data;
};

/// Where one object of async_fetch_many lands: at `offset` of `region`, a
/// region of the consumer's registry (Access::local is enough) that the
/// caller keeps registered; an object (or the part of it `range` names)
/// larger than `capacity` is refused with `out_of_range`.
struct FetchSlot {
  RegionGuard* region = nullptr;
  std::uint64_t offset = 0;
  std::uint64_t capacity = 0;
  ByteRange range{};
};

/// async_fetch_many's answer: one outcome per name, in the names' order.
using ManyFetched = std::vector<Result<FetchOutcome>>;

struct ConsumerStats {
  PathCounters decisions;
  std::uint64_t fallbacks = 0;
  std::uint64_t renewals = 0;    ///< lease renewals, one `renew` frame each (owners of versions 1 to 3)
  std::uint64_t heartbeats = 0;  ///< heartbeats answered, each renewing every lease of the connection (version 4)
  std::uint64_t pushes = 0;  ///< objects the owner wrote into a landing (async_push_fetch)
};

/// One control connection to an owner. Fetches may be started concurrently
/// from several coroutines and run at once on the connection, RDMA
/// transfers included (up to ConsumerConfig::max_fetches_in_flight): one
/// reader hands each answer to the request it answers, and one lease keeper
/// renews the leases of every fetch together. Runs on one executor, like
/// Owner.
///
/// Its operations are Asio initiating functions: any completion token
/// (callbacks, `deferred`, `use_future`...), `use_awaitable` by default, so
/// `co_await consumer->async_fetch(name)` reads as a plain call. Each runs as
/// a coroutine of its own on the consumer's executor; the token's
/// cancellation slot reaches it (see async_fetch), and the handler runs on
/// its associated executor.
class Consumer {
 public:
  using DefaultToken = boost::asio::use_awaitable_t<>;

  /// Connects and says hello; with a registry, offers RDMA through its
  /// backend. Completes with Result<std::unique_ptr<Consumer>>.
  template <class Token = DefaultToken>
  static auto connect(boost::asio::any_io_executor executor, boost::asio::ip::tcp::endpoint owner,
                      std::shared_ptr<Registry> registry, ConsumerConfig config, Token&& token = {}) {
    return detail::as_operation(executor, connect_and_greet(executor, owner, std::move(registry), std::move(config)),
                                std::forward<Token>(token));
  }
  /// The same with the default config. An overload, not a default
  /// argument: g++ 12 mishandles a default argument's temporary (its
  /// strings) when the call sits inside a co_await expression.
  template <class Token = DefaultToken>
    requires(!std::is_same_v<std::decay_t<Token>, ConsumerConfig>)
  static auto connect(boost::asio::any_io_executor executor, boost::asio::ip::tcp::endpoint owner,
                      std::shared_ptr<Registry> registry, Token&& token = {}) {
    return connect(std::move(executor), owner, std::move(registry), ConsumerConfig{}, std::forward<Token>(token));
  }

  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;
  ~Consumer();

  /// Fetches `name`. Tries RDMA when the owner grants it and falls back to
  /// the chunked path exactly once on any failure of that path, except the
  /// loss of the owner itself (the connection closed, a renewal failed),
  /// which is answered `peer_unreachable` as soon as it is noticed; the lease
  /// is released in every outcome that leaves an owner to release it to. A
  /// cancelled fetch answers `cancelled` at its next safe point: at once
  /// while it waits for a place, once the answer it waits for is in (or the
  /// owner fell silent for the io timeout), between pulls, between windows, or once an RDMA get
  /// under way has ended (never before: the get reads under the fetch's
  /// lease). The connection stays usable for every other fetch
  /// (docs/protocol.md, "Cancelling a fetch").
  /// Completes with Result<Fetched>.
  template <class Token = DefaultToken>
    requires(!std::is_same_v<std::decay_t<Token>, ByteRange>)
  auto async_fetch(std::string name, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_coroutine(std::move(name), {}), std::forward<Token>(token));
  }
  /// The same for a part of the object: `Fetched::data` holds the range's
  /// bytes. Over RDMA only the range is read; an object lent in windows
  /// skips the windows before it (version 5 owners; older ones lend them,
  /// unread), and the chunked path pulls the range alone.
  template <class Token = DefaultToken>
  auto async_fetch(std::string name, ByteRange range, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_coroutine(std::move(name), range), std::forward<Token>(token));
  }

  /// Fetches `name` into `destination`: a region of the consumer's registry
  /// (Access::local is enough) that the caller keeps registered across
  /// fetches, so a warm fetch registers nothing here. The object lands at the
  /// region's start; an object larger than the region is refused with
  /// `out_of_range` (its lease released). Same paths and fallback as async_fetch.
  /// When the owner is lost during an RDMA transfer, the fetch is answered
  /// `peer_unreachable` at once, while a transfer its backend cannot end
  /// keeps the region registered (an unmap waits for it): the memory may be
  /// reused once the region's deregistered() resolves. `destination` must
  /// outlive the operation. Completes with Result<FetchOutcome>.
  template <class Token = DefaultToken>
    requires(!std::is_same_v<std::decay_t<Token>, ByteRange>)
  auto async_fetch_into(std::string name, RegionGuard& destination, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_into_coroutine(std::move(name), destination, {}),
                                std::forward<Token>(token));
  }
  /// The same for a part of the object, landing at the region's start.
  template <class Token = DefaultToken>
  auto async_fetch_into(std::string name, RegionGuard& destination, ByteRange range, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_into_coroutine(std::move(name), destination, range),
                                std::forward<Token>(token));
  }

  /// Fetches `name` into `sink`, chunk by chunk as the chunks arrive, with
  /// no buffer for the whole object (a file written as it comes, say); over
  /// RDMA the object lands in fresh memory and the sink receives it whole.
  /// Same paths and fallback as async_fetch; a sink's error ends the fetch
  /// (its lease released). Completes with Result<FetchOutcome>.
  template <class Token = DefaultToken>
    requires(!std::is_same_v<std::decay_t<Token>, ByteRange>)
  auto async_fetch_to(std::string name, ChunkSink sink, Token&& token = {}) {
    StreamDestination destination{std::move(sink), {}};
    return detail::as_operation(executor(), fetch_to_coroutine(std::move(name), std::move(destination), {}),
                                std::forward<Token>(token));
  }
  /// The same, with the RDMA read landing where `destination` says (a file
  /// written with no copy of an RDMA read). A landing that cannot be had
  /// (its function fails, or gives less than the object's size) fails the
  /// fetch with that error, its lease released.
  template <class Token = DefaultToken>
    requires(!std::is_same_v<std::decay_t<Token>, ByteRange>)
  auto async_fetch_to(std::string name, StreamDestination destination, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_to_coroutine(std::move(name), std::move(destination), {}),
                                std::forward<Token>(token));
  }
  /// The same for a part of the object: the sink is handed the range's
  /// bytes (at their offsets in the object), and a landing is asked for the
  /// range's length.
  template <class Token = DefaultToken>
  auto async_fetch_to(std::string name, StreamDestination destination, ByteRange range, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_to_coroutine(std::move(name), std::move(destination), range),
                                std::forward<Token>(token));
  }

  /// Fetches every object of `names` into its slot of `destinations` (the
  /// same length; `out_of_range` otherwise, and nothing is fetched). With a
  /// version 2 owner the set goes in batches of up to the owner's limit:
  /// one round trip acquires a batch, one seam batch reads every object the
  /// owner granted over RDMA (each remote key imported once per export and
  /// kept), and one round trip releases it; objects in chunks, and objects
  /// whose RDMA read failed (exactly one fallback each), are pulled in
  /// between. Each object has its own outcome: not found, refused, too
  /// large for its slot or changed while read fail alone. When the
  /// connection or the owner is lost, or the operation is cancelled, the
  /// objects not yet fetched answer that error, those of a batch whose
  /// RDMA read was under way too (once it ended, as for async_fetch). Slots must not overlap and
  /// their regions must outlive the operation. Completes with
  /// Result<ManyFetched>.
  template <class Token = DefaultToken>
  auto async_fetch_many(std::vector<std::string> names, std::vector<FetchSlot> destinations, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_many_coroutine(std::move(names), std::move(destinations)),
                                std::forward<Token>(token));
  }

  /// Has the owner write `name` into `landing` at `options.offset` (the
  /// prefill→decode shape: the bytes go where this side wants them, with no
  /// read to issue here). `landing` is a region of the consumer's registry
  /// registered with Access::remote_read_write, kept registered by the
  /// caller; its key goes to this owner alone, with the landing's bytes from
  /// the offset on, and the owner writes only the object's bytes there
  /// (`out_of_range` when they do not fit). The first push on a connection
  /// sets up the owner's peer towards this side (one more round trip).
  /// Answered once the bytes are in place. When the owner takes no pushes
  /// (an older protocol, OwnerConfig::accept_push off, its budget full, a
  /// failed write), the object is fetched into the landing as
  /// async_fetch_into would, exactly once, and the outcome says why
  /// (`pushed` false, `push_refusal`). A cancelled push fetch answers once
  /// the owner has stopped writing (its answer came or the connection was
  /// lost): its landing is then no longer written. Completes with
  /// Result<FetchOutcome>.
  template <class Token = DefaultToken>
  auto async_push_fetch(std::string name, RegionGuard& landing, PushOptions options = {}, Token&& token = {}) {
    return detail::as_operation(executor(), push_fetch_coroutine(std::move(name), landing, options),
                                std::forward<Token>(token));
  }

  /// The protocol version agreed with the owner.
  [[nodiscard]] std::uint16_t protocol_version() const noexcept;
  /// The owner id the owner proved with the cluster key; empty without a
  /// key (ConsumerConfig::cluster_key).
  [[nodiscard]] const std::string& proven_owner() const noexcept;
  /// Whether the owner accepted this consumer's RDMA offer.
  [[nodiscard]] bool rdma_ready() const noexcept;
  /// Whether the connection to the owner is still open: false once it was
  /// lost (the owner closed it, say for idleness, or died) or closed, after
  /// which every fetch fails with `peer_unreachable`; connect again.
  [[nodiscard]] bool is_connected() const noexcept;
  [[nodiscard]] ConsumerStats stats() const;

  struct State;

 private:
  explicit Consumer(std::shared_ptr<State> state);

  static boost::asio::awaitable<Result<std::unique_ptr<Consumer>>> connect_and_greet(
      boost::asio::any_io_executor executor, boost::asio::ip::tcp::endpoint owner, std::shared_ptr<Registry> registry,
      ConsumerConfig config);
  [[nodiscard]] boost::asio::any_io_executor executor() const;
  [[nodiscard]] boost::asio::awaitable<Result<Fetched>> fetch_coroutine(std::string name, ByteRange range);
  [[nodiscard]] boost::asio::awaitable<Result<FetchOutcome>> fetch_into_coroutine(std::string name,
                                                                                   RegionGuard& destination,
                                                                                   ByteRange range);
  [[nodiscard]] boost::asio::awaitable<Result<FetchOutcome>> fetch_to_coroutine(std::string name,
                                                                                 StreamDestination destination,
                                                                                 ByteRange range);
  [[nodiscard]] boost::asio::awaitable<Result<FetchOutcome>> push_fetch_coroutine(std::string name,
                                                                                   RegionGuard& landing,
                                                                                   PushOptions options);
  [[nodiscard]] boost::asio::awaitable<Result<ManyFetched>> fetch_many_coroutine(std::vector<std::string> names,
                                                                                 std::vector<FetchSlot> slots);

  std::shared_ptr<State> state_;
};

}  // namespace corma
