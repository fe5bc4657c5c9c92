// The state of an Owner, shared by the files that implement it:
// owner_leases.cpp (objects, leases, batches), owner_exports.cpp
// (registrations, the export cache, windows), owner_session.cpp (one
// connection: its hello, its requests worked on concurrently), owner_push.cpp
// (writing objects into consumers' memory) and owner.cpp
// (the public operations). Parts with one job of their own are objects of
// their own, each written only through its operations: the objects
// published and the generations lent (publications.hpp), the leases
// granted and the places acquires hold against the caps (lease_table.hpp),
// the registrations lent and under way by name (export_table.hpp),
// and the queue of acquires and windows with the coroutine that runs it
// (work_dispatcher.hpp).
#pragma once

#include "rendezvous/owner/answer_queue.hpp"
#include "rendezvous/owner/connection_table.hpp"
#include "rendezvous/owner/export_table.hpp"
#include "rendezvous/owner/lease_table.hpp"
#include "rendezvous/owner/publications.hpp"
#include "rendezvous/owner/push_peer_table.hpp"
#include "rendezvous/owner/work_dispatcher.hpp"
#include "rendezvous/protocol/framed_connection.hpp"
#include "rendezvous/protocol/messages.hpp"

#include <corma/owner.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace corma {

namespace rendezvous {

/// An error as the owner answers it (its detail cut to what a frame carries).
inline ErrorReply error_reply(const Error& error) {
  return ErrorReply{static_cast<std::uint16_t>(error.code.value()), error.detail.substr(0, max_detail_length)};
}

/// The chunked reason an export's failure gives.
inline ChunkedReason reason_for(const Error& error) {
  if (error.is(errc::budget_exceeded)) return ChunkedReason::budget;
  if (error.is(errc::not_configured)) return ChunkedReason::not_configured;
  if (error.is(errc::shutting_down)) return ChunkedReason::draining;
  return ChunkedReason::registration_failed;
}

}  // namespace rendezvous

struct Owner::State : std::enable_shared_from_this<State> {
  // The protocol's pieces, by their short names.
  using Acquire = rendezvous::Acquire;
  using AcquireMany = rendezvous::AcquireMany;
  using AnswerQueue = rendezvous::AnswerQueue;
  using ErrorReply = rendezvous::ErrorReply;
  using Export = rendezvous::Export;
  using Frame = rendezvous::Frame;
  using FramedConnection = rendezvous::FramedConnection;
  using Grant = rendezvous::Grant;
  using Lease = rendezvous::Lease;
  using Message = rendezvous::Message;
  using NextWindow = rendezvous::NextWindow;
  using Push = rendezvous::Push;
  using PushConnect = rendezvous::PushConnect;
  using PushOpen = rendezvous::PushOpen;
  using Pull = rendezvous::Pull;
  using Release = rendezvous::Release;
  using ReleaseMany = rendezvous::ReleaseMany;
  using Renew = rendezvous::Renew;
  template <class T>
  using Awaitable = boost::asio::awaitable<T>;

  boost::asio::any_io_executor executor;
  std::shared_ptr<Registry> registry;
  OwnerConfig config;

  /// The objects published by name and the generations of what is lent.
  rendezvous::Publications publications;
  ObjectResolver resolver;
  /// Set instead of `resolver`: names are looked up off the event loop.
  AsyncObjectResolver async_resolver;
  /// Run once before each turn of acquires looks names up (set_resolver).
  std::function<void()> refresh_resolver;
  /// The leases granted, and the places acquires under way hold.
  rendezvous::LeaseTable leases;
  /// Exports whose leases stop() dropped, kept (registered, bytes alive)
  /// until the Owner goes: see Owner::stop().
  std::vector<std::shared_ptr<Export>> retired;
  /// The registration each name's leases read now, and those under way
  /// (published objects stay registered between leases in the registry's
  /// cache, config.cache_exports, which also evicts them for room).
  rendezvous::ExportTable exports;
  /// The connections, their handshakes and session ids, and the acceptors
  /// a serve() waits on: stop() cancels their accepts, so that no work of
  /// the owner's is left in its io_context.
  rendezvous::ConnectionTable connections;
  bool draining = false;
  OwnerStats stats;
  boost::asio::steady_timer reaper;
  /// Acquires and windows of every connection, run by dispatch() a turn at a
  /// time, each turn followed by the connections' I/O.
  rendezvous::WorkDispatcher work;

  State(boost::asio::any_io_executor ex, std::shared_ptr<Registry> r, OwnerConfig c)
      : executor(ex), registry(std::move(r)), config(c), leases(c.lease_timeout),
        exports(ex),
        connections(c.max_connections, c.max_handshakes),
        reaper(ex),
        work(ex) {}

  // ---- objects, leases, batches (owner_leases.cpp) ----

  Result<PublishedObject> find(std::string_view name);
  /// A name the async resolver looks up, answered on the owner's executor;
  /// `abandoned` cancels the look-up (its acquire's connection went).
  Awaitable<Result<PublishedObject>> resolve(std::string name, boost::asio::cancellation_slot abandoned);

  /// An acquire under way (or a push), counted against the lease caps
  /// while it lasts: a connection's requests are worked on concurrently.
  struct AcquireUnderWay {
    State& state;
    std::uint64_t session;
    AcquireUnderWay(State& s, std::uint64_t id) : state(s), session(id) { state.leases.acquire_began(session); }
    AcquireUnderWay(const AcquireUnderWay&) = delete;
    AcquireUnderWay& operator=(const AcquireUnderWay&) = delete;
    ~AcquireUnderWay() { state.leases.acquire_ended(session); }
  };

  /// Why `session` may not take one more lease, if it may not: its own cap,
  /// the owner's, or, once the owner holds half its cap, the connection's
  /// share of it (max_leases / (2 x open connections)).
  std::optional<Error> lease_cap_refusal(std::uint64_t session) const;

  /// Whether `lease` reads an object that was published again since.
  bool republished_since(const Lease& lease) const;

  /// An acquire that needs a registration before it can be answered: its
  /// lease as far as it is known, counted against the lease caps meanwhile.
  struct PendingAcquire {
    Lease lease;
    bool cacheable = false;  ///< a published object: its export may be kept
    bool windows = false;
    std::unique_ptr<AcquireUnderWay> under_way;
    /// The name is still to be looked up (async_resolver), and the lease
    /// decided after.
    bool unresolved = false;
    bool wants_rdma = false;
    bool rdma_peer = false;
  };
  using PreparedAcquire = std::variant<Grant, PendingAcquire>;

  /// Everything of an acquire that needs no waiting: the name's checks, the
  /// lease caps (before the name is looked up), the look-up, and the answer
  /// itself when no registration is needed (chunked, or an export that is
  /// cached or being read). `windows`: the consumer speaks version 2, so an
  /// object whose registration does not fit the budget may be lent in
  /// windows.
  PreparedAcquire prepare_acquire(std::uint64_t session, bool rdma_peer, bool windows, const Acquire& request);

  /// The rest: looks the name up if the async resolver has it, registers
  /// the object (or its first window) and answers.
  /// `abandoned` is emitted when the acquire's connection goes: a look-up
  /// still under way is then given up (the resolver may stop reading).
  Awaitable<Grant> complete_acquire(PendingAcquire pending, boost::asio::cancellation_slot abandoned);

  /// An acquire's answer once its object is found: chunked when it needs
  /// no registration (or cannot have one), the export at hand when one is,
  /// else what complete_acquire() must register.
  PreparedAcquire decide(PendingAcquire pending, Result<PublishedObject> object);

  /// Records `lease` and answers for it: chunked with `reason`, else RDMA.
  Grant grant_lease(Lease lease, std::optional<rendezvous::ChunkedReason> reason);

  /// The slice a pull asks for, checked against its lease, with the
  /// object's keepalive: it is written straight from there, and must outlive
  /// the write even if the lease goes meanwhile.
  Result<PublishedObject> pull(std::uint64_t session, const Pull& request);

  Message renew(std::uint64_t session, const Renew& request);

  /// Renews every lease `session` holds (protocol version 4).
  Message heartbeat(std::uint64_t session);

  /// Ends the lease. A consumer reports success only after this answer: it
  /// is `object_changed` when the object was published again while the
  /// lease read it, so the consumer never reports a possible mix.
  Message release(std::uint64_t session, const Release& request);

  /// The batch limit told to consumers: within what one answer frame holds,
  /// and half the lease cap, so a consumer may have two batches leased at
  /// once (one being read while the next is granted).
  std::uint16_t announced_batch() const;

  /// Counts a batch request of `size` elements, or refuses it when it is
  /// over the limit announced in the hello.
  std::optional<ErrorReply> admit_batch(std::size_t size);

  /// Ends every lease of a batch, each answered as a single release would
  /// be; a lease this connection does not hold is named, and left alone.
  Message release_many(std::uint64_t session, const ReleaseMany& request);

  Awaitable<void> reap();

  // ---- registrations, the export cache, windows (owner_exports.cpp) ----

  /// How an object's export is registered: kept in the registry's cache
  /// (with its keepalive) when it is a published object and the config
  /// says so, else registered for its leases alone.
  RegistrationOptions export_options(const PublishedObject& object, bool cacheable) const;

  /// `name` is published again or the owner stops: its current registration is
  /// handed out no more, and its cached one is invalidated.
  void forget_export(const std::string& name);

  /// The registration of `object` that leases of `name` read: the live
  /// one, a cached one, or a new one (one at a time per name).
  Awaitable<Result<std::shared_ptr<Export>>> export_object(const std::string& name, const PublishedObject& object,
                                                           bool cacheable);

  Awaitable<Result<std::shared_ptr<Export>>> register_export(const std::string& name, const PublishedObject& object,
                                                             bool cacheable);

  /// The live export of `object`, or one made at once from a registration
  /// the registry keeps cached for it (recorded for the leases after):
  /// null when a registration is needed. No waiting, so a warm acquire
  /// (whose last lease ended, leaving only the cached registration) is
  /// granted in its turn without a coroutine of its own.
  std::shared_ptr<Export> export_at_once(const std::string& name, const PublishedObject& object, bool cacheable);

  /// The length of a window starting at `start`, for one of `sharers`
  /// leases lent in windows now: the budget split in `sharers + 1` shares
  /// (one kept free, so a newcomer finds room and the shares shrink as
  /// each lease moves on), within what is left, [min_window, max_window],
  /// and never past the object's end. The budget charges whole pages, so a
  /// window is a whole number of pages, less one when it starts off a page
  /// boundary.
  std::uint64_t window_length(const std::byte* start, std::uint64_t remaining, std::size_t sharers) const;

  /// Registers the window of `object` starting at `offset` (read-only, for
  /// this lease alone): as long as window_length() says, shorter when that
  /// does not fit (the registry gives idle cached ones up first), down to
  /// min_window. `budget_exceeded` when not even that fits.
  Awaitable<Result<std::shared_ptr<Export>>> export_window(const PublishedObject& object, std::uint64_t offset,
                                                           std::size_t sharers);

  /// Moves a windowed lease's window forward, to start where the current one
  /// ends or further on: the current window is deregistered first (its bytes back in the
  /// budget), then the next registered. Asked out of order, past the end,
  /// or on a lease not lent in windows, it is refused and the lease kept.
  Awaitable<Message> next_window(std::uint64_t session, NextWindow request);

  // ---- one connection (owner_session.cpp) ----

  /// What a finished hello leaves a session with.
  struct Greeting {
    bool ok = false;             ///< hello_ok was sent: serve the connection
    std::optional<PeerId> peer;  ///< the consumer's RDMA peer, when its offer was taken
    std::uint16_t version = 0;   ///< the protocol version both sides speak
  };

  Awaitable<Greeting> handshake(FramedConnection& connection);

  /// What a connection's requests need to know of it.
  struct Session {
    std::uint64_t id = 0;
    bool rdma_peer = false;  ///< the consumer's RDMA offer was taken
    bool version2 = false;   ///< batches and windows
    bool version3 = false;   ///< push
    bool version4 = false;   ///< the connection's heartbeat
  };

  /// Queues an acquire, a batch of them or a window for dispatch(); they
  /// are answered when their turn and their registrations are done.
  void queue_request(const Session& session, AnswerQueue& answers, Frame frame);

  /// Runs the queued acquires and windows, a turn at a time, until the
  /// owner stops.
  Awaitable<void> dispatch();

  /// Takes one request (already begun in `answers`): what needs no waiting
  /// is answered now, in order; acquires and windows are queued. False when the
  /// connection ends after this answer (a consumer sent an owner message).
  Awaitable<bool> take(const Session& session, AnswerQueue& answers, Frame frame);

  Awaitable<void> session(boost::asio::ip::tcp::socket socket);

  // ---- push (owner_push.cpp) ----

  /// Each connection's push peer: this owner's backend initiates it, so
  /// that it may write into the consumer (the hello's peer goes the other
  /// way). Closed when the session ends.
  rendezvous::PushPeerTable push_peers;

  /// Works on a push request (push_open, push_connect or push) in the
  /// background and answers it in `answers`.
  void start_push_request(const Session& session, AnswerQueue& answers, Frame frame);
  Awaitable<Message> push_open(std::uint64_t session);
  Awaitable<Message> push_connect(std::uint64_t session, PushConnect request);
  /// Writes the object into the consumer's landing, then notifies or
  /// flushes, so that `pushed` is answered once the bytes are in place.
  Awaitable<Message> push(std::uint64_t session, Push request);
  /// The session ended: its push peer is closed.
  Awaitable<void> close_push_peer(std::uint64_t session);

  /// Turns a connection away with one `budget_exceeded` frame, written
  /// without waiting (a fresh socket's send buffer takes it whole), and closes it.
  void refuse(boost::asio::ip::tcp::socket& socket);
};

}  // namespace corma
