#include "consumer_state.hpp"
#include "keep_until_deregistered.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cstring>
#include <deque>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;
using namespace asio::experimental::awaitable_operators;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

/// Runs `work` to its end, deaf to the caller's cancellation.
template <class T>
asio::awaitable<T> to_its_end(asio::any_io_executor executor, asio::awaitable<T> work) {
  auto done = co_await asio::co_spawn(executor, detail::without_throwing(std::move(work)),
                                      asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  co_return std::move(*done);
}

}  // namespace

namespace rendezvous {

Error from_reply(const ErrorReply& reply) {
  return Error{std::error_code(reply.code, error_category()), "owner: " + reply.detail};
}

Error fetch_cancelled(std::string_view when) { return Error{errc::cancelled, "fetch cancelled " + std::string(when)}; }

asio::awaitable<bool> cancelled_here() {
  auto state = co_await asio::this_coro::cancellation_state;
  co_return state.cancelled() != asio::cancellation_type::none;
}

}  // namespace rendezvous

ChunkSink copy_into(std::span<std::byte> memory) {
  return [memory](std::uint64_t offset, std::span<const std::byte> bytes) -> Result<void> {
    std::memcpy(memory.data() + offset, bytes.data(), bytes.size());
    return success();
  };
}

Consumer::State::Destination registered_destination(RegionGuard& region, std::uint64_t offset,
                                                    std::uint64_t capacity) {
  return {[&region, offset, capacity](std::uint64_t size) -> Result<std::span<std::byte>> {
            if (!region) return fail(errc::region_not_found, "destination is not registered");
            if (size > capacity) {
              return fail(errc::out_of_range, "object of " + std::to_string(size) + " bytes does not fit its " +
                                                  std::to_string(capacity) + "-byte destination");
            }
            return region.bytes().subspan(offset, size);
          },
          &region,
          offset,
          nullptr,
          nullptr};
}

Result<void> check_name(std::string_view name) {
  if (name.empty() || name.size() > max_name_length) {
    return fail(errc::out_of_range, "object name of " + std::to_string(name.size()) + " bytes is outside 1.." +
                                        std::to_string(max_name_length));
  }
  return success();
}

Consumer::State::State(asio::any_io_executor ex, std::shared_ptr<Registry> r, ConsumerConfig c)
    : executor(ex), registry(std::move(r)), config(std::move(c)), turn(ex, 1) {
  turn.try_send(boost::system::error_code{});
}

// ---- requests -------------------------------------------------------------------

asio::awaitable<Result<Message>> Consumer::State::request(Message message) {
  CORMA_CO_TRY(const auto id, co_await send(std::move(message)));
  co_return co_await answer_to(id);
}

asio::awaitable<Result<std::uint64_t>> Consumer::State::send(Message message) {
  co_return co_await to_its_end(executor, write_request(std::move(message)));
}

asio::awaitable<Result<Message>> Consumer::State::answer_to(std::uint64_t id) {
  unanswered.erase(id);
  if (auto found = parked.find(id); found != parked.end()) {
    auto answer = std::move(found->second);
    parked.erase(found);
    co_return answer;
  }
  co_return co_await to_its_end(executor, read_answer(id));
}

asio::awaitable<Result<std::uint64_t>> Consumer::State::write_request(Message message) {
  if (!connection || !connection->is_open()) co_return fail(errc::peer_unreachable, "connection to the owner is closed");
  const std::uint64_t id = next_request++;
  Frame frame{id, std::move(message)};
  if (auto written = co_await connection->write(frame, config.io_timeout); !written) {
    connection->close();
    co_return std::move(written).error();
  }
  unanswered.insert(id);
  co_return id;
}

asio::awaitable<Result<Message>> Consumer::State::read_answer(std::uint64_t id) {
  if (!connection || !connection->is_open()) co_return fail(errc::peer_unreachable, "connection to the owner is closed");
  for (int stale = 0; stale < 16;) {
    auto reply = co_await connection->read(config.io_timeout);
    if (!reply) {
      connection->close();
      co_return std::move(reply).error();
    }
    const auto answered = reply.value().request_id;
    // Request id 0 answers no request: the owner refuses the connection
    // itself (too many connections) before closing it.
    if (answered == 0) {
      if (auto* error = std::get_if<ErrorReply>(&reply.value().message)) co_return from_reply(*error);
    }
    Result<Message> answer = std::move(reply.value().message);
    if (auto* error = std::get_if<ErrorReply>(&answer.value())) answer = from_reply(*error);
    if (answered == id) co_return answer;
    if (unanswered.erase(answered) != 0) {
      parked.emplace(answered, std::move(answer));  // a pipelined request's answer, for its reader
    } else {
      ++stale;  // an answer nobody waits for any more
    }
  }
  connection->close();
  co_return fail(errc::protocol, "owner keeps answering other requests");
}

asio::awaitable<bool> Consumer::State::park_next() {
  auto reply = co_await to_its_end(executor, connection->read(config.io_timeout));
  if (!reply) {
    connection->close();
    co_return false;
  }
  const auto answered = reply.value().request_id;
  if (unanswered.erase(answered) == 0) co_return false;
  Result<Message> answer = std::move(reply.value().message);
  if (auto* error = std::get_if<ErrorReply>(&answer.value())) answer = from_reply(*error);
  parked.emplace(answered, std::move(answer));
  co_return true;
}

// ---- the chunked path -------------------------------------------------------------

asio::awaitable<Result<void>> Consumer::State::pull_all(std::uint64_t lease, std::uint64_t size,
                                                        std::uint32_t chunk, const ChunkSink& write) {
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

Result<void> Consumer::State::take_chunk(std::uint64_t offset, std::uint32_t len, Result<Message> reply,
                                         const ChunkSink& write) {
  CORMA_TRY(auto message, std::move(reply));
  auto* data = std::get_if<Data>(&message);
  if (data == nullptr || data->offset != offset || data->bytes.size() != len) {
    connection->close();
    return fail(errc::protocol, "owner answered a pull with the wrong bytes");
  }
  return write(offset, data->bytes);
}

asio::awaitable<Result<void>> Consumer::State::release(std::uint64_t lease) {
  Release message{lease};
  auto answer = co_await request(message);
  if (!answer && answer.error().is(errc::object_changed)) co_return std::move(answer).error();
  co_return success();
}

// ---- the RDMA path -------------------------------------------------------------------

asio::awaitable<Error> Consumer::State::give_up_owner(const Error& why, asio::cancellation_signal& cancel) {
  owner_lost = Error{errc::peer_unreachable, "lost the owner during the transfer: " + why.message()};
  cancel.emit(asio::cancellation_type::terminal);
  if (peer) {
    const auto gone = *std::exchange(peer, std::nullopt);
    imported_keys.clear();  // gone with the peer
    (void)co_await registry->backend()->async_peer_close(gone, asio::use_awaitable);
  }
  co_return *owner_lost;
}

asio::awaitable<Result<void>> Consumer::State::renew(std::span<const std::uint64_t> leases) {
  std::vector<std::uint64_t> asked;
  asked.reserve(leases.size());
  Result<void> outcome = success();
  for (auto lease : leases) {
    auto id = co_await send(Renew{lease});
    if (!id) {
      outcome = std::move(id).error();
      break;
    }
    asked.push_back(id.value());
  }
  // Every answer asked for is read, so the connection stays in step.
  for (auto id : asked) {
    auto renewed = co_await answer_to(id);
    if (renewed) {
      ++stats.renewals;
    } else if (outcome) {
      outcome = std::move(renewed).error();
    }
  }
  co_return outcome;
}

asio::awaitable<std::optional<Error>> Consumer::State::supervise_transfer(std::span<const std::uint64_t> leases,
                                                                         std::uint32_t lease_timeout_ms,
                                                                         const StartTransfer& start) {
  const auto interval = std::clamp(std::chrono::milliseconds(lease_timeout_ms / 3), std::chrono::milliseconds(10),
                                   std::chrono::milliseconds(1000));
  asio::steady_timer wake(executor);
  asio::cancellation_signal cancel;
  bool answered = false;
  start(cancel.slot(), [&answered, &wake] {
    answered = true;
    wake.cancel();
  });
  std::optional<Error> stopped;  // why the transfer was cancelled
  bool keep_deadline = false;      // the timer already runs towards the next renewal
  while (!answered) {
    if (stopped) {
      // Only the transfer's answer is awaited now (it wakes this).
      wake.expires_at(asio::steady_timer::time_point::max());
      co_await wake.async_wait(as_result);
      continue;
    }
    // The connection is watched between renewals too. The owner sends
    // nothing unasked, so a readable connection means a pipelined request
    // was answered (parked for its reader), or else the connection ended (a
    // dead owner's kernel closes it at once) or the owner refused
    // something: the renewal then goes out at once, and reading its answer tells.
    if (!keep_deadline) wake.expires_after(interval);
    auto woke = co_await (wake.async_wait(as_result) ||
                          connection->socket().async_wait(asio::socket_base::wait_read, as_result));
    keep_deadline = false;
    if (answered) continue;
    const bool readable = woke.index() == 1 && !std::get<0>(std::get<1>(woke));
    if (readable && !unanswered.empty() && !co_await cancelled_here() && co_await park_next()) {
      keep_deadline = true;
      continue;
    }
    if (co_await cancelled_here()) {
      stopped = fetch_cancelled("during the rdma get");
      cancel.emit(asio::cancellation_type::terminal);
      continue;
    }
    auto renewed = co_await renew(leases);
    if (!renewed) stopped = co_await give_up_owner(renewed.error(), cancel);
  }
  co_return stopped;
}

asio::awaitable<Result<void>> Consumer::State::read_remote(const std::vector<std::byte>& descriptor_bytes,
                                                           std::uint64_t len, std::uint64_t lease,
                                                           std::uint32_t lease_timeout_ms, RegionGuard& guard,
                                                           std::uint64_t offset) {
  CORMA_CO_TRY(auto descriptor, decode_descriptor(descriptor_bytes));
  if (descriptor.len != len) co_return fail(errc::protocol, "descriptor length differs from what was granted");
  std::optional<Result<void>> got;
  const auto remote = to_remote_region(descriptor);
  const StartTransfer start = [&](asio::cancellation_slot slot, std::function<void()> answered) {
    guard.async_get(*peer, remote, TransferRange{offset, 0, len},
                    asio::bind_cancellation_slot(
                        slot, asio::bind_executor(executor, [&got, answered = std::move(answered)](Result<void> r) {
                          got = std::move(r);
                          answered();
                        })));
  };
  const std::uint64_t leases[] = {lease};
  auto stopped = co_await supervise_transfer(leases, lease_timeout_ms, start);
  if (!*got && stopped) co_return std::move(*stopped);
  co_return std::move(*got);
}

asio::awaitable<Result<void>> Consumer::State::rdma_get_into(const RdmaGrant& grant, RegionGuard& guard,
                                                             std::uint64_t offset) {
  co_return co_await read_remote(grant.descriptor, grant.size, grant.lease, grant.lease_timeout_ms, guard, offset);
}

asio::awaitable<Result<void>> Consumer::State::read_windows(const RdmaWindow& first, RegionGuard& guard,
                                                            std::uint64_t base, const ChunkSink& sink,
                                                            std::uint32_t& windows) {
  RdmaWindow window = first;
  for (std::uint64_t expected = 0;;) {
    if (window.lease != first.lease || window.size != first.size || window.offset != expected) {
      co_return fail(errc::protocol, "owner lent a window other than the next one");
    }
    CORMA_CO_TRY(co_await read_remote(window.descriptor, window.window_len, window.lease, window.lease_timeout_ms,
                                      guard, base + window.offset));
    ++windows;
    if (sink) {
      CORMA_CO_TRY(sink(window.offset, guard.bytes().subspan(base + window.offset, window.window_len)));
    }
    expected = window.offset + window.window_len;
    if (config.on_progress) config.on_progress(expected, window.size);
    if (expected >= window.size) co_return success();
    if (co_await cancelled_here()) co_return fetch_cancelled("between two windows");
    NextWindow next{window.lease, expected};
    CORMA_CO_TRY(auto reply, co_await request(next));
    auto* lent = std::get_if<RdmaWindow>(&reply);
    if (lent == nullptr) co_return fail(errc::protocol, "owner answered next_window with something else");
    window = std::move(*lent);
  }
}

asio::awaitable<Result<void>> Consumer::State::rdma_get(RegionGuard guard,
                                                        const std::function<void(DeregisteredEvent)>& keep_until,
                                                        const ReadInto& read) {
  auto got = co_await read(guard, 0);
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

asio::awaitable<Result<RemoteKeyId>> Consumer::State::key_for(const PackedKey& packed) {
  if (auto found = imported_keys.find(packed); found != imported_keys.end()) co_return found->second;
  if (!peer) co_return fail(errc::peer_unreachable, "no RDMA peer for this owner");
  const auto backend = registry->backend();
  if (imported_keys.size() >= max_imported_keys) {
    // Bounded: the keys of exports long gone would otherwise pile up.
    for (const auto& [bytes, key] : imported_keys) backend->async_release_key(key, [](Result<void>) {});
    imported_keys.clear();
  }
  CORMA_CO_TRY(auto key, co_await backend->async_import_key(*peer, packed, asio::use_awaitable));
  imported_keys.emplace(packed, key);
  co_return key;
}

// ---- fetches ----------------------------------------------------------------------------

asio::awaitable<Result<std::span<std::byte>>> Consumer::State::span_to_fill(const Destination& destination,
                                                                            std::uint64_t lease, std::uint64_t size) {
  auto into = destination.span_for(size);
  if (!into) (void)co_await release(lease);
  co_return into;
}

asio::awaitable<Result<FetchOutcome>> Consumer::State::fetch(std::string name, const Destination& destination) {
  CORMA_CO_TRY(check_name(name));
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
  } else if (auto* window = std::get_if<RdmaWindow>(&reply)) {
    lease = window->lease;
    fetched.size = window->size;
  } else {
    co_return fail(errc::protocol, "owner answered an acquire with something else");
  }
  const auto* grant = std::get_if<RdmaGrant>(&reply);
  const auto* window = std::get_if<RdmaWindow>(&reply);
  if (co_await cancelled_here()) {
    (void)co_await release(lease);
    co_return fetch_cancelled("after the owner granted it");
  }
  // A streamed chunked fetch needs no memory of its own.
  Result<std::span<std::byte>> into = std::span<std::byte>{};
  if (!destination.sink || grant != nullptr || window != nullptr) {
    into = co_await span_to_fill(destination, lease, fetched.size);
    if (!into) co_return std::move(into).error();
  }

  if (grant != nullptr || window != nullptr) {
    // Windows go to the sink one by one as they land; a whole grant after
    // (unless they landed where they belong).
    ChunkSink rdma_sink = destination.rdma_lands_for_good ? ChunkSink{} : destination.sink;
    const ReadInto read = [&](RegionGuard& guard, std::uint64_t base) {
      return grant != nullptr ? rdma_get_into(*grant, guard, base)
                              : read_windows(*window, guard, base, rdma_sink, fetched.windows);
    };
    // (Not a conditional expression: g++ 12 mishandles co_await inside one.)
    Result<void> got = success();
    OwnedBuffer spare;  // for a landing the backend cannot register
    if (destination.registered != nullptr) {
      got = co_await read(*destination.registered, destination.registered_offset);
    } else {
      auto guard = co_await registry->async_register(into.value(), Access::local, asio::use_awaitable);
      const std::function<void(DeregisteredEvent)> keep_spare = [&spare](DeregisteredEvent released) {
        keep_until_deregistered(std::move(spare), released);
      };
      const auto* keep_until = &destination.keep_until;
      // A landing refused by the backend is replaced; one whose registration
      // was cancelled is not: the fetch answers the cancellation below.
      if (!guard && destination.rdma_lands_for_good && !guard.error().is(errc::cancelled)) {
        // The caller's landing cannot be registered (a NIC may refuse to
        // pin a file's shared mapping): the read lands in fresh memory
        // instead, handed to the sink as without a landing.
        spare = OwnedBuffer::allocate(std::max<std::uint64_t>(fetched.size, 1));
        into = spare.bytes().first(fetched.size);
        rdma_sink = destination.sink;
        keep_until = &keep_spare;
        guard = co_await registry->async_register(into.value(), Access::local, asio::use_awaitable);
      }
      if (guard) {
        got = co_await rdma_get(std::move(guard).value(), *keep_until, read);
      } else {
        got = std::move(guard).error();
      }
    }
    if (got && rdma_sink && grant != nullptr) got = rdma_sink(0, into.value().first(fetched.size));
    if (got) {
      if (config.on_progress && grant != nullptr) config.on_progress(fetched.size, fetched.size);
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
  // Named, not a temporary inside the co_await: g++ 12 destroys those twice.
  const ChunkSink write = destination.sink ? destination.sink : copy_into(into.value());
  auto pulled = co_await pull_all(lease, fetched.size, chunk, write);
  auto released = co_await release(lease);
  if (!pulled) co_return std::move(pulled).error();
  CORMA_CO_TRY(released);
  fetched.path = Path::chunked;
  ++stats.decisions.chunked_by_reason[fetched.fell_back ? "rdma_failed" : fetched.reason];
  co_return fetched;
}

asio::awaitable<Result<void>> Consumer::State::hello() {
  Hello hello;
  hello.version = config.protocol_version;
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
  const auto offered_version = hello.version;
  CORMA_CO_TRY(auto reply, co_await request(std::move(hello)));
  auto* ok = std::get_if<HelloOk>(&reply);
  if (ok == nullptr) co_return fail(errc::protocol, "owner did not answer hello");
  if (ok->version < oldest_protocol_version || ok->version > offered_version) {
    co_return fail(errc::protocol, "owner answered with protocol version " + std::to_string(ok->version));
  }
  version = ok->version;
  max_batch = std::max<std::uint16_t>(ok->max_batch, 1);
  if (pending && ok->backend == offered && !ok->peer_answer.empty()) {
    auto completed = co_await registry->backend()->async_peer_complete(*pending, std::move(ok->peer_answer),
                                                                      asio::use_awaitable);
    if (completed) peer = pending;
  }
  co_return success();
}

}  // namespace corma
