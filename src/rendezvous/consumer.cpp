#include <corma/consumer.hpp>

#include "framed_connection.hpp"
#include "keep_until_deregistered.hpp"

#include <corma/descriptor.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <deque>
#include <cstring>
#include <optional>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;
using namespace asio::experimental::awaitable_operators;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);
/// Pull size on the fallback path, where the owner named no chunk size.
constexpr std::uint32_t fallback_chunk = 256 * 1024;

Error from_reply(const ErrorReply& reply) {
  return Error{std::error_code(reply.code, error_category()), "owner: " + reply.detail};
}

/// Runs `work` to its end, deaf to the caller's cancellation.
template <class T>
asio::awaitable<T> to_its_end(asio::any_io_executor executor, asio::awaitable<T> work) {
  auto done = co_await asio::co_spawn(executor, detail::without_throwing(std::move(work)),
                                      asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  co_return std::move(*done);
}

/// Whether the fetch running on this coroutine thread has been cancelled.
asio::awaitable<bool> cancelled_here() {
  auto state = co_await asio::this_coro::cancellation_state;
  co_return state.cancelled() != asio::cancellation_type::none;
}

Error fetch_cancelled(std::string_view when) { return Error{errc::cancelled, "fetch cancelled " + std::string(when)}; }

}  // namespace

struct Consumer::State {
  asio::any_io_executor executor;
  std::shared_ptr<Registry> registry;
  ConsumerConfig config;
  std::unique_ptr<FramedConnection> connection;
  std::optional<PeerId> peer;
  std::uint64_t next_request = 1;
  /// Why the owner was given up during a transfer, once it was: the
  /// connection is closed and nothing more is asked of that owner.
  std::optional<Error> owner_lost;
  // One token: whoever holds it talks on the connection.
  asio::experimental::channel<void(boost::system::error_code)> turn;
  ConsumerStats stats;

  State(asio::any_io_executor ex, std::shared_ptr<Registry> r, ConsumerConfig c)
      : executor(ex), registry(std::move(r)), config(c), turn(ex, 1) {
    turn.try_send(boost::system::error_code{});
  }

  /// Sends one request and waits for the answer with the same id. A request
  /// that does not end with its answer (a failed write or read, a deadline)
  /// closes the connection: a half-written frame cannot be taken back, and
  /// an unanswered request must never share the wire with the next one. A
  /// cancelled fetch therefore never interrupts a request: it stops once the
  /// answer is in (at most io_timeout later), and the connection stays in
  /// step for the fetches queued behind it.
  asio::awaitable<Result<Message>> request(Message message) {
    CORMA_CO_TRY(const auto id, co_await send(std::move(message)));
    co_return co_await answer_to(id);
  }

  /// Writes one request (to its end); its id, for answer_to(). Several may
  /// be sent before their answers are read: the owner answers in order.
  asio::awaitable<Result<std::uint64_t>> send(Message message) {
    co_return co_await to_its_end(executor, write_request(std::move(message)));
  }

  /// Reads the answer to request `id` (to its end), skipping stale ones.
  asio::awaitable<Result<Message>> answer_to(std::uint64_t id) {
    co_return co_await to_its_end(executor, read_answer(id));
  }

  asio::awaitable<Result<std::uint64_t>> write_request(Message message) {
    if (!connection || !connection->is_open()) co_return fail(errc::peer_unreachable, "connection to the owner is closed");
    const std::uint64_t id = next_request++;
    Frame frame{id, std::move(message)};
    if (auto written = co_await connection->write(frame, config.io_timeout); !written) {
      connection->close();
      co_return std::move(written).error();
    }
    co_return id;
  }

  asio::awaitable<Result<Message>> read_answer(std::uint64_t id) {
    if (!connection || !connection->is_open()) co_return fail(errc::peer_unreachable, "connection to the owner is closed");
    for (int stale = 0; stale < 16; ++stale) {
      auto reply = co_await connection->read(config.io_timeout);
      if (!reply) {
        connection->close();
        co_return std::move(reply).error();
      }
      // Request id 0 answers no request: the owner refuses the connection
      // itself (too many connections) before closing it.
      if (reply.value().request_id == 0) {
        if (auto* error = std::get_if<ErrorReply>(&reply.value().message)) co_return from_reply(*error);
      }
      if (reply.value().request_id != id) continue;  // an answer nobody waits for any more
      if (auto* error = std::get_if<ErrorReply>(&reply.value().message)) co_return from_reply(*error);
      co_return std::move(reply.value().message);
    }
    connection->close();
    co_return fail(errc::protocol, "owner keeps answering other requests");
  }

  /// Reads the object in chunks, keeping up to `pull_window` pulls on the
  /// wire so that the owner's reads, the network and our copies overlap.
  /// A cancelled fetch stops asking and reads the answers already asked
  /// for, so the connection stays in step.
  asio::awaitable<Result<void>> pull_all(std::uint64_t lease, std::uint64_t size, std::uint32_t chunk,
                                         const ChunkSink& write) {
    struct Asked {
      std::uint64_t id;
      std::uint64_t offset;
      std::uint32_t len;
    };
    std::deque<Asked> asked;
    const std::size_t window = std::max<std::size_t>(config.pull_window, 1);
    std::uint64_t next = 0;
    std::uint64_t received = 0;
    bool cancelled = false;
    while (received < size) {
      cancelled = cancelled || co_await cancelled_here();
      while (!cancelled && asked.size() < window && next < size) {
        const auto len = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, size - next));
        CORMA_CO_TRY(const auto id, co_await send(Pull{lease, next, len}));
        asked.push_back(Asked{id, next, len});
        next += len;
      }
      if (asked.empty()) co_return fetch_cancelled("during the chunked read");
      const Asked pull = asked.front();
      asked.pop_front();
      auto reply = co_await answer_to(pull.id);
      auto taken = take_chunk(pull.offset, pull.len, std::move(reply), write);
      if (!taken) {
        // The fetch ends here; the answers to the pulls behind it are read
        // first, so the connection stays in step (a closed one answers at once).
        for (const auto& behind : asked) (void)co_await answer_to(behind.id);
        co_return std::move(taken).error();
      }
      received += pull.len;
      if (config.on_progress) config.on_progress(received, size);
    }
    co_return success();
  }

  /// Checks the answer to a pull of [offset, offset + len) and hands its
  /// bytes to `write`. Wrong bytes close the connection: answers still on
  /// the wire would be out of step.
  Result<void> take_chunk(std::uint64_t offset, std::uint32_t len, Result<Message> reply, const ChunkSink& write) {
    CORMA_TRY(auto message, std::move(reply));
    auto* data = std::get_if<Data>(&message);
    if (data == nullptr || data->offset != offset || data->bytes.size() != len) {
      connection->close();
      return fail(errc::protocol, "owner answered a pull with the wrong bytes");
    }
    return write(offset, data->bytes);
  }

  /// Ends a lease. The owner answers `object_changed` when the object was
  /// published again while the lease read it: then what was read may be a
  /// mix, and the fetch fails. Any other trouble with the answer says
  /// nothing about the bytes and is not the fetch's failure.
  asio::awaitable<Result<void>> release(std::uint64_t lease) {
    Release message{lease};
    auto answer = co_await request(message);
    if (!answer && answer.error().is(errc::object_changed)) co_return std::move(answer).error();
    co_return success();
  }

  /// The owner is gone (request() closed the connection to it): the get
  /// that depends on it is cancelled (terminal: it is answered now, while
  /// its bytes may still land into a region that stays registered until it
  /// really ends), and the peer goes, so that the backend ends what its
  /// provider can end and answers the rest as unreachable.
  asio::awaitable<Error> give_up_owner(const Error& why, asio::cancellation_signal& cancel_get) {
    owner_lost = Error{errc::peer_unreachable, "lost the owner during the transfer: " + why.message()};
    cancel_get.emit(asio::cancellation_type::terminal);
    if (peer) {
      const auto gone = *std::exchange(peer, std::nullopt);
      (void)co_await registry->backend()->async_peer_close(gone, asio::use_awaitable);
    }
    co_return *owner_lost;
  }

  /// Gets the granted object into `guard` (at its start), renewing the lease
  /// while the transfer runs. Renewing at least every second, and watching
  /// the connection in between, bounds how long a dead owner goes
  /// unnoticed. When the owner is lost, or the fetch is cancelled, the get is
  /// cancelled (terminal) rather than left to its own deadline, and this
  /// returns once the get has answered.
  asio::awaitable<Result<void>> rdma_get_into(const RdmaGrant& grant, RegionGuard& guard) {
    CORMA_CO_TRY(auto descriptor, decode_descriptor(grant.descriptor));
    if (descriptor.len != grant.size) co_return fail(errc::protocol, "descriptor length differs from the object size");
    const auto interval = std::clamp(std::chrono::milliseconds(grant.lease_timeout_ms / 3),
                                     std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
    asio::steady_timer wake(executor);
    asio::cancellation_signal cancel_get;
    std::optional<Result<void>> got;
    guard.async_get(*peer, to_remote_region(descriptor), TransferRange{0, 0, grant.size},
                    asio::bind_cancellation_slot(cancel_get.slot(),
                                                 asio::bind_executor(executor, [&got, &wake](Result<void> outcome) {
                                                   got = std::move(outcome);
                                                   wake.cancel();
                                                 })));
    std::optional<Error> stopped;  // why the get was cancelled
    while (!got) {
      if (stopped) {
        // Only the get's answer is awaited now (its handler wakes this).
        wake.expires_at(asio::steady_timer::time_point::max());
        co_await wake.async_wait(as_result);
        continue;
      }
      // The connection is watched between renewals too. The owner sends
      // nothing unasked, so a readable connection means it ended (a dead
      // owner's kernel closes it at once) or the owner refused something:
      // the renewal then goes out at once, and reading its answer tells.
      wake.expires_after(interval);
      co_await (wake.async_wait(as_result) ||
                connection->socket().async_wait(asio::socket_base::wait_read, as_result));
      if (got) continue;
      if (co_await cancelled_here()) {
        stopped = fetch_cancelled("during the rdma get");
        cancel_get.emit(asio::cancellation_type::terminal);
        continue;
      }
      auto renewed = co_await request(Renew{grant.lease});
      if (renewed) {
        ++stats.renewals;
        continue;
      }
      stopped = co_await give_up_owner(renewed.error(), cancel_get);
    }
    if (!*got && stopped) co_return std::move(*stopped);
    co_return std::move(*got);
  }

  /// The same into memory registered for this one transfer.
  asio::awaitable<Result<void>> rdma_get(const RdmaGrant& grant, std::span<std::byte> into,
                                         const std::function<void(DeregisteredEvent)>& keep_until) {
    CORMA_CO_TRY(auto guard, co_await registry->async_register(into, Access::local, asio::use_awaitable));
    auto got = co_await rdma_get_into(grant, guard);
    if (!got) {
      // A failed get may have been answered before it ended (cancelled,
      // with its owner or by the fetch, or past its deadline), and a
      // provider may be unable to end it at all once its peer died: the
      // destination then stays registered until the backend lets go of it.
      // The fetch does not wait for that; `keep_until` takes the memory
      // over until then.
      keep_until(guard.deregistered());
      co_return got;  // the guard's destruction deregisters in the background
    }
    // The destination is ours again only once the registration is gone.
    // (Deaf to cancellation: the wait is the point.)
    co_await guard.async_deregister(asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
    co_return got;
  }

  /// Where a fetch puts the bytes: given the object's size, the span to fill
  /// (a fresh one on each call), and the registered region it lies in (null:
  /// register it per transfer; after a failed transfer `keep_until` takes
  /// the span's memory over, to free it once the event resolves).
  struct Destination {
    std::function<Result<std::span<std::byte>>(std::uint64_t size)> span_for;
    RegionGuard* registered = nullptr;
    std::function<void(DeregisteredEvent)> keep_until;
    /// When set, chunks go here as they arrive instead of into span_for's
    /// memory (which then only serves an RDMA get, handed over whole).
    ChunkSink sink;
  };

  /// Where the object goes; when it has nowhere to go, the lease is released.
  asio::awaitable<Result<std::span<std::byte>>> span_to_fill(const Destination& destination, std::uint64_t lease,
                                                             std::uint64_t size) {
    auto into = destination.span_for(size);
    if (!into) (void)co_await release(lease);
    co_return into;
  }

  asio::awaitable<Result<FetchOutcome>> fetch(std::string name, const Destination& destination) {
    Acquire acquire{name, peer.has_value()};
    CORMA_CO_TRY(auto reply, co_await request(std::move(acquire)));
    if (std::holds_alternative<NotFound>(reply)) {
      co_return fail(errc::region_not_found, "owner has no object named '" + name + "'");
    }
    FetchOutcome fetched;
    std::uint64_t lease = 0;
    std::uint32_t chunk = fallback_chunk;
    if (auto* chunked = std::get_if<Chunked>(&reply)) {
      lease = chunked->lease;
      fetched.size = chunked->size;
      fetched.reason = to_string(chunked->reason);
      chunk = chunked->chunk_size;
    } else if (auto* grant = std::get_if<RdmaGrant>(&reply)) {
      lease = grant->lease;
      fetched.size = grant->size;
    } else {
      co_return fail(errc::protocol, "owner answered an acquire with something else");
    }
    if (co_await cancelled_here()) {
      (void)co_await release(lease);
      co_return fetch_cancelled("after the owner granted it");
    }
    // A streamed chunked fetch needs no memory of its own.
    Result<std::span<std::byte>> into = std::span<std::byte>{};
    if (!destination.sink || std::holds_alternative<RdmaGrant>(reply)) {
      into = co_await span_to_fill(destination, lease, fetched.size);
      if (!into) co_return std::move(into).error();
    }

    if (auto* grant = std::get_if<RdmaGrant>(&reply)) {
      // (Not a conditional expression: g++ 12 mishandles co_await inside one.)
      Result<void> got = success();
      if (destination.registered != nullptr) {
        got = co_await rdma_get_into(*grant, *destination.registered);
      } else {
        got = co_await rdma_get(*grant, into.value(), destination.keep_until);
      }
      if (got && destination.sink) got = destination.sink(0, into.value().first(fetched.size));
      if (got) {
        if (config.on_progress) config.on_progress(fetched.size, fetched.size);
        fetched.path = Path::rdma;
        CORMA_CO_TRY(co_await release(lease));
        ++stats.decisions.rdma;
        co_return fetched;
      }
      // No fallback from a lost owner: its chunks would come over the
      // connection that just ended (and the lease died with it).
      if (owner_lost) co_return *owner_lost;
      if (co_await cancelled_here()) {
        (void)co_await release(lease);
        co_return std::move(got).error();
      }
      // Exactly one fallback: the chunked path on the same lease, into
      // fresh memory when the failed get's memory was taken over.
      fetched.fell_back = true;
      fetched.reason = "rdma failed: " + got.error().message();
      ++stats.fallbacks;
      if (destination.registered == nullptr && !destination.sink) {
        into = co_await span_to_fill(destination, lease, fetched.size);
        if (!into) co_return std::move(into).error();
      }
    }
    const std::span<std::byte> memory = into.value();
    const ChunkSink copy_into_memory = [memory](std::uint64_t offset, std::span<const std::byte> bytes) -> Result<void> {
      std::memcpy(memory.data() + offset, bytes.data(), bytes.size());
      return success();
    };
    auto pulled = co_await pull_all(lease, fetched.size, chunk, destination.sink ? destination.sink : copy_into_memory);
    auto released = co_await release(lease);
    if (!pulled) co_return std::move(pulled).error();
    CORMA_CO_TRY(released);
    fetched.path = Path::chunked;
    ++stats.decisions.chunked_by_reason[fetched.fell_back ? "rdma_failed" : fetched.reason];
    co_return fetched;
  }

  asio::awaitable<Result<void>> hello() {
    Hello hello;
    std::optional<PeerId> pending;
    if (registry && config.use_rdma) {
      auto offer = co_await registry->backend()->async_peer_offer(asio::use_awaitable);
      if (offer) {
        hello.backend = registry->backend()->wire_id();
        hello.peer_offer = std::move(offer.value().blob);
        pending = offer.value().peer;
      }
    }
    const auto offered = hello.backend;
    CORMA_CO_TRY(auto reply, co_await request(std::move(hello)));
    auto* ok = std::get_if<HelloOk>(&reply);
    if (ok == nullptr) co_return fail(errc::protocol, "owner did not answer hello");
    if (pending && ok->backend == offered && !ok->peer_answer.empty()) {
      auto completed = co_await registry->backend()->async_peer_complete(*pending, std::move(ok->peer_answer),
                                                                        asio::use_awaitable);
      if (completed) peer = pending;
    }
    co_return success();
  }
};

asio::awaitable<Result<std::unique_ptr<Consumer>>> Consumer::connect_and_greet(asio::any_io_executor executor,
                                                                               asio::ip::tcp::endpoint owner,
                                                                               std::shared_ptr<Registry> registry,
                                                                               ConsumerConfig config) {
  auto state = std::make_shared<State>(executor, std::move(registry), config);
  asio::ip::tcp::socket socket(executor);
  asio::steady_timer timer(executor, config.io_timeout);
  auto connected = co_await (socket.async_connect(owner, as_result) || timer.async_wait(as_result));
  if (connected.index() == 1) co_return fail(errc::timeout, "connecting to the owner timed out");
  if (auto [ec] = std::get<0>(connected); ec) {
    co_return fail(errc::peer_unreachable, "cannot connect to the owner: " + ec.message());
  }
  state->connection = std::make_unique<FramedConnection>(std::move(socket), default_max_frame_body);
  // Chunks arrive frame after frame: their buffer is kept, not made per chunk.
  state->connection->keep_read_buffer_up_to(default_max_frame_body);
  CORMA_CO_TRY(co_await state->hello());
  co_return std::unique_ptr<Consumer>(new Consumer(std::move(state)));
}

Consumer::Consumer(std::shared_ptr<State> state) : state_(std::move(state)) {}

Consumer::~Consumer() {
  if (state_->connection) state_->connection->close();
  if (state_->peer && state_->registry) {
    state_->registry->backend()->async_peer_close(*state_->peer, [](Result<void>) {});
  }
}

namespace {

/// Hands the connection's turn to the next fetch, however this one ends.
struct GiveBack {
  Consumer::State& s;
  ~GiveBack();
};

/// Waits for the connection's turn. A fetch cancelled while it waits never
/// held the turn and must not give one back: that would mint a second turn,
/// and two fetches would then talk on one connection at once.
asio::awaitable<Result<void>> take_turn(Consumer::State& state) {
  auto [ec] = co_await state.turn.async_receive(as_result);
  if (ec) co_return fail(errc::cancelled, "fetch cancelled while it waited for the connection");
  co_return success();
}

/// Fresh memory for one fetch, allocated into `holder` when the fetch needs
/// it; a transfer that outlives the fetch takes it over until its
/// registration is gone.
Consumer::State::Destination fresh_buffer_in(OwnedBuffer& holder, ChunkSink sink = {}) {
  return {[&holder](std::uint64_t size) -> Result<std::span<std::byte>> {
            holder = OwnedBuffer::allocate(std::max<std::uint64_t>(size, 1));
            return holder.bytes().first(size);
          },
          nullptr,
          [&holder](DeregisteredEvent released) { keep_until_deregistered(std::move(holder), released); },
          std::move(sink)};
}

asio::awaitable<Result<Fetched>> fetch_new(std::shared_ptr<Consumer::State> state, std::string name) {
  CORMA_CO_TRY(co_await take_turn(*state));
  GiveBack give_back{*state};
  Fetched fetched;
  CORMA_CO_TRY(auto outcome, co_await state->fetch(std::move(name), fresh_buffer_in(fetched.data)));
  static_cast<FetchOutcome&>(fetched) = std::move(outcome);
  co_return fetched;
}

asio::awaitable<Result<FetchOutcome>> fetch_to(std::shared_ptr<Consumer::State> state, std::string name,
                                               ChunkSink sink) {
  CORMA_CO_TRY(co_await take_turn(*state));
  GiveBack give_back{*state};
  OwnedBuffer rdma_landing;  // used only when the owner grants RDMA
  co_return co_await state->fetch(std::move(name), fresh_buffer_in(rdma_landing, std::move(sink)));
}

asio::awaitable<Result<FetchOutcome>> fetch_into(std::shared_ptr<Consumer::State> state, std::string name,
                                                 RegionGuard& destination) {
  CORMA_CO_TRY(co_await take_turn(*state));
  GiveBack give_back{*state};
  Consumer::State::Destination registered{[&destination](std::uint64_t size) -> Result<std::span<std::byte>> {
                                  if (!destination) return fail(errc::region_not_found, "destination is not registered");
                                  if (size > destination.size()) {
                                    return fail(errc::out_of_range, "object of " + std::to_string(size) +
                                                                        " bytes does not fit the destination region");
                                  }
                                  return destination.bytes().first(size);
                                },
                                &destination,
                                nullptr,
                                nullptr};
  co_return co_await state->fetch(std::move(name), registered);
}

GiveBack::~GiveBack() { s.turn.try_send(boost::system::error_code{}); }

}  // namespace

// A fetch runs on a coroutine thread of its own (detail::as_operation): a
// cancelled fetch is answered `cancelled` once it reached a safe point,
// never by an exception thrown out of the middle of a request.
asio::awaitable<Result<Fetched>> Consumer::fetch_coroutine(std::string name) {
  return fetch_new(state_, std::move(name));
}

asio::awaitable<Result<FetchOutcome>> Consumer::fetch_into_coroutine(std::string name, RegionGuard& destination) {
  return fetch_into(state_, std::move(name), destination);
}

asio::awaitable<Result<FetchOutcome>> Consumer::fetch_to_coroutine(std::string name, ChunkSink sink) {
  return fetch_to(state_, std::move(name), std::move(sink));
}

asio::any_io_executor Consumer::executor() const { return state_->executor; }

bool Consumer::rdma_ready() const noexcept { return state_->peer.has_value(); }
ConsumerStats Consumer::stats() const { return state_->stats; }

}  // namespace corma
