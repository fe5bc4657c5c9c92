// Owner: the embeddable side of the rendezvous that publishes byte ranges
// and lends them out, over RDMA when it can and in chunks when it cannot.
#pragma once

#include <corma/detail/as_operation.hpp>
#include <corma/error.hpp>
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
#include <span>
#include <string>
#include <string_view>

namespace corma {

/// A published byte range. `keepalive` (may be empty) holds whatever owns
/// the bytes (a mapping, a buffer) for as long as a lease or an export uses them.
struct PublishedObject {
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> keepalive;
  /// What a resolver found is one version of its name while this (compared
  /// by owner, and held weakly: the resolver keeps it alive) stays the same;
  /// `keepalive` when empty. Every fetch of one version is told the same
  /// generation, also when the resolver lends it under a fresh keepalive
  /// each time (to hear when each lending ends).
  std::shared_ptr<const void> version = {};
};

/// Finds objects the owner did not publish up front (corma serve reads
/// files on demand). Answer `region_not_found` for unknown names. Names
/// reach it only once check_object_name() accepts them.
using ObjectResolver = std::function<Result<PublishedObject>(std::string_view name)>;

/// The completion of an AsyncObjectResolver's look-up.
using ResolveHandler = boost::asio::any_completion_handler<void(Result<PublishedObject>)>;

/// Finds objects like ObjectResolver, without holding up the owner's event
/// loop while it works (a file read, a query): it completes `done` exactly
/// once, from any thread (the owner takes the answer back to its own
/// executor), with what ObjectResolver would return. The owner goes on
/// serving every other request meanwhile; the acquire counts against the
/// lease caps until it is answered. `done`'s cancellation slot is emitted
/// (terminal) when the connection that asked goes away: a resolver may then
/// stop its work and answer `cancelled`, and the owner's session does not
/// wait for the look-up any longer than the resolver takes to answer.
using AsyncObjectResolver = std::function<void(std::string name, ResolveHandler done)>;

/// Run before a turn of look-ups (the names of the acquires from every
/// connection the owner works on next): a resolver that keeps what it found
/// brings it up to date here, once, instead of once per name. A name looked
/// up after it then sees every change made before its request arrived.
using ResolverRefresh = std::function<void()>;

struct OwnerConfig {
  /// Objects smaller than this are always served in chunks.
  std::uint64_t rdma_threshold = 64 * 1024;
  /// Largest pull the owner answers (and suggests).
  std::uint32_t chunk_size = 1 << 20;
  /// A lease lapses this long after its last acquire, renew or pull.
  std::chrono::milliseconds lease_timeout{10000};
  /// How often abandoned leases are looked for.
  std::chrono::milliseconds reap_interval{250};
  /// A connection silent this long between frames is closed (counted from
  /// the last frame read, also while its answer is worked on: registrations
  /// take far less).
  std::chrono::milliseconds idle_timeout{60000};
  /// Deadline for the hello, for reading the rest of a frame once its first
  /// byte came, and for every write.
  std::chrono::milliseconds io_timeout{10000};
  /// Leases one connection may hold at once.
  std::size_t max_leases_per_connection = 512;
  /// Requests of one connection worked on at once: an acquire or window
  /// waiting for its registration does not hold up the pulls, renewals and
  /// releases behind it. Past this many unanswered requests the
  /// connection's next frame is not read until one is answered.
  std::size_t max_requests_in_flight = 32;
  /// Names one connection's acquires may have queued or under way at once
  /// (a batch counts its names): past it the connection's next frame is
  /// not read until some are answered. A consumer pipelining batches keeps
  /// two of them (at most 2 x 251 names) in flight.
  std::size_t max_names_in_flight = 1024;
  /// Objects one batch request (protocol version 2) may name; a larger
  /// batch is refused whole (`budget_exceeded`). Announced to consumers in
  /// the hello, capped at half of max_leases_per_connection (a consumer
  /// keeps two batches leased: one read while the next is granted) and at
  /// what one answer frame holds (about 250).
  std::size_t max_batch_objects = 256;
  /// Leases the owner holds at once, over all connections; past it acquires
  /// are answered `budget_exceeded`. Past half of it, a connection already
  /// holding its share (max_leases / (2 x open connections)) is refused
  /// too, so that a few connections can never fill it and leave a newcomer
  /// without a lease.
  std::size_t max_leases = 65536;
  /// Open connections; past it a new connection is answered
  /// `budget_exceeded` ("too many connections") and closed.
  std::size_t max_connections = 1024;
  /// Connections that have not finished their hello; past it new ones are
  /// refused the same way (a flood of silent connections cannot crowd out
  /// the consumers that talk).
  std::size_t max_handshakes = 128;
  /// An object whose registration does not fit the budget is lent to a
  /// version 2 consumer in windows: slices registered one after the other
  /// under its lease, each an equal share of the budget left among the
  /// windowed leases, within [min_window, max_window]. Only when not even
  /// min_window fits is it served in chunks (reason `no_window`).
  std::uint64_t min_window = 1 << 20;
  std::uint64_t max_window = 64 << 20;
  /// Keeps published objects registered between leases, in the registry's
  /// cache (Caching::keep, with the object's keepalive), so a repeated fetch
  /// costs no registration on this side. Cached exports nobody is reading
  /// are deregistered when a registration needs their room in the budget,
  /// when the name is published again, and when the owner stops. Objects
  /// found by the resolver are exported per lease (a file may change under
  /// its name).
  bool cache_exports = true;
  /// Takes pushes (protocol version 3): a consumer offers memory of its own
  /// for one object and this owner writes the object into it, then tells
  /// it so, instead of the consumer reading. This owner then connects a
  /// peer of its backend to each consumer that asks (the reverse of the
  /// hello's peer) and writes with the consumer's key. Both come from the
  /// consumer: corma checks their framing, but UCX does not check the
  /// worker address or key inside them (it may abort on a malformed one),
  /// so turn this on only for consumers trusted that far (the same trust
  /// as UcxConfig::trusted_peers). verbs records are corma's own, checked
  /// whole.
  bool accept_push = false;
  /// The cluster's shared key (at least 16 bytes; empty: none) and this
  /// owner's id (1 to 255 bytes; the id it announces in a directory). With
  /// both, a consumer's challenge before its hello (version 6) is answered
  /// with proof that this owner holds the key and is that id; without a
  /// key, such a challenge is refused (`not_owned`) and the connection
  /// closed. Consumers without a key are served either way.
  std::string cluster_key{};
  std::string owner_id{};
};

struct OwnerStats {
  PathCounters decisions;
  std::uint64_t not_found = 0;
  std::uint64_t batch_requests = 0;  ///< acquire_many and release_many requests answered (protocol version 2)
  std::uint64_t pulls = 0;
  std::uint64_t pulled_bytes = 0;
  std::uint64_t refused_requests = 0;  ///< forged leases and renews, out-of-range pulls, bad versions, malformed frames
  std::uint64_t leases_expired = 0;
  std::uint64_t leases_released = 0;
  std::uint64_t live_leases = 0;
  std::uint64_t connections = 0;       ///< accepted, ever
  std::uint64_t open_connections = 0;  ///< being served now
  std::uint64_t refused_connections = 0;  ///< turned away at max_connections / max_handshakes
  std::uint64_t exports_registered = 0;  ///< registrations made for leases, ever
  std::uint64_t exports_evicted = 0;     ///< cached exports given up for room in the budget
  std::uint64_t windows = 0;             ///< windows registered for objects larger than the budget holds
  std::uint64_t pushes = 0;              ///< objects written into consumers' memory (protocol version 3)
  std::uint64_t pushed_bytes = 0;
  std::uint64_t heartbeats = 0;          ///< heartbeats answered, each renewing a connection's leases (version 4)
};

/// Runs on one executor (give it a single-threaded io_context or a strand):
/// its coroutines share state without locks.
class Owner {
 public:
  /// `registry` may be null: everything is then served in chunks.
  Owner(boost::asio::any_io_executor executor, std::shared_ptr<Registry> registry, OwnerConfig config = {});
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;
  ~Owner();

  void publish(std::string name, PublishedObject object);
  /// Withdraws `name`: later acquires of it go to the resolver, if one is
  /// set, or are answered not found, and nothing of it stays registered or
  /// remembered once its leases end. Leases granted on it keep reading
  /// the bytes they were lent (their `keepalive` holds them); their
  /// release answers `object_changed`, as after a new publication. False
  /// when `name` was not published.
  bool unpublish(std::string_view name);
  /// Names not published are looked up by `resolver` (replacing any
  /// resolver set before, of either kind).
  void set_resolver(ObjectResolver resolver, ResolverRefresh refresh = {});
  void set_resolver(AsyncObjectResolver resolver, ResolverRefresh refresh = {});

  /// Accepts and serves connections until stop(), the acceptor closes or
  /// the operation is cancelled; each connection is a coroutine of its own.
  /// An initiating function for any completion token (`use_awaitable` by
  /// default), completing with no arguments; `acceptor` must outlive it.
  template <class Token = boost::asio::use_awaitable_t<>>
  auto serve(boost::asio::ip::tcp::acceptor& acceptor, Token&& token = {}) {
    return detail::as_operation(executor(), accept_loop(acceptor), std::forward<Token>(token));
  }

  /// Drains: new acquires are answered `chunked` (draining), connections are
  /// closed, leases dropped, and serve() completes (its acceptor is left
  /// open: it is the caller's); once the work already queued has run, the
  /// owner holds no work in its io_context. The registrations the leases
  /// used, and their bytes, are kept until the Owner is destroyed: a peer
  /// may still be reading them, and some providers serve a peer's read by
  /// copying on this side whether or not the memory is still registered (UCX
  /// over shared memory or tcp). So shut the backend down (which ends every
  /// peer) before destroying a stopped Owner; the registry's shutdown
  /// releases them too.
  void stop();

  [[nodiscard]] OwnerStats stats() const;

  struct State;

 private:
  [[nodiscard]] boost::asio::any_io_executor executor() const;
  [[nodiscard]] boost::asio::awaitable<void> accept_loop(boost::asio::ip::tcp::acceptor& acceptor);

  std::shared_ptr<State> state_;
};

}  // namespace corma
