#include "rendezvous/consumer/consumer_state.hpp"
#include "rendezvous/protocol/owner_proof.hpp"
#include "rendezvous/consumer/keep_until_deregistered.hpp"

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

/// Text a peer sent, fit for an error message: control and non-ASCII bytes
/// become '?', so that it cannot forge lines or steer a terminal.
std::string printable(std::string_view text) {
  std::string out(text.substr(0, 255));
  for (auto& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

}  // namespace

namespace rendezvous {

Error fetch_cancelled(std::string_view when) { return Error{errc::cancelled, "fetch cancelled " + std::string(when)}; }

Result<void> release_verdict(std::uint16_t code) {
  if (code == static_cast<std::uint16_t>(errc::object_changed)) {
    return fail(errc::object_changed, "owner: the object was published again during the lease");
  }
  if (code == static_cast<std::uint16_t>(errc::region_not_found)) {
    return fail(errc::timeout, "the owner no longer held the lease when it was released (it lapsed): nothing "
                               "proves the bytes read under it one version");
  }
  return success();
}

asio::awaitable<bool> cancelled_here() {
  auto state = co_await asio::this_coro::cancellation_state;
  co_return state.cancelled() != asio::cancellation_type::none;
}

Result<Slice> slice_of(const ByteRange& range, std::uint64_t size) {
  if (range.offset > size || (range.length && *range.length > size - range.offset)) {
    return fail(errc::out_of_range, "the range [" + std::to_string(range.offset) + ", " +
                                        (range.length ? "+" + std::to_string(*range.length) : std::string("end")) +
                                        ") does not lie within the object's " + std::to_string(size) + " bytes");
  }
  return Slice{range.offset, range.length.value_or(size - range.offset)};
}

}  // namespace rendezvous

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
          {}};
}

Consumer::State::State(asio::any_io_executor ex, std::shared_ptr<Registry> r, ConsumerConfig c)
    : executor(ex), registry(std::move(r)), config(std::move(c)), fetches(ex, config.max_fetches_in_flight) {}

Consumer::State::~State() {
  if (leases) leases->stop();
  if (link) link->close();
}

void Consumer::State::open(asio::ip::tcp::socket socket) {
  link = std::make_shared<ConsumerLink>(std::move(socket), config.io_timeout);
  leases = std::make_shared<LeaseKeeper>(link);
  // The link outlives nothing it calls back into: the state holds it, and
  // the state's destruction closes it first (no loss reported then).
  link->start([this](const Error&) { owner_lost(); });
  leases->start();
}

void Consumer::State::owner_lost() {
  for (auto* transfer : transfers) transfer->emit(asio::cancellation_type::terminal);
  leases->stop();
  imported_keys.clear();  // gone with the peer
  if (peer) {
    registry->backend()->async_peer_close(*std::exchange(peer, std::nullopt), [](Result<void>) {});
  }
  if (push_peer) {
    registry->backend()->async_peer_close(*std::exchange(push_peer, std::nullopt), [](Result<void>) {});
  }
}

std::optional<Error> Consumer::State::lost() const {
  if (!link->lost()) return std::nullopt;
  return Error{errc::peer_unreachable, "lost the owner during the transfer: " + link->lost()->message()};
}

// ---- requests -------------------------------------------------------------------

asio::awaitable<Result<Message>> Consumer::State::request(Message message) {
  co_return co_await link->ask(std::move(message));
}

// ---- the chunked path -------------------------------------------------------------

asio::awaitable<Result<void>> Consumer::State::pull_all(PullJob job) {
  std::vector<PullJob> one{std::move(job)};
  auto pulled = co_await pull_objects(std::move(one));
  co_return std::move(pulled.front());
}

asio::awaitable<std::vector<Result<void>>> Consumer::State::pull_objects(std::vector<PullJob> jobs) {
  struct Asked {
    std::uint64_t id;
    std::size_t job;
    std::uint64_t offset;
    std::uint32_t len;
  };
  std::deque<Asked> asked;
  // The window is bytes, not pulls: pull_window of the largest chunks. A set
  // of objects smaller than a chunk keeps as many bytes on the wire as one
  // large object does, so that a long round trip is filled either way.
  std::uint64_t largest_chunk = 1;
  for (const auto& job : jobs) largest_chunk = std::max<std::uint64_t>(largest_chunk, job.chunk);
  const std::uint64_t window = std::max<std::uint64_t>(config.pull_window, 1) * largest_chunk;
  std::uint64_t on_the_wire = 0;
  std::vector<std::uint64_t> next(jobs.size(), 0);
  for (std::size_t j = 0; j < jobs.size(); ++j) next[j] = jobs[j].slice.offset;
  std::vector<std::uint64_t> received(jobs.size(), 0);
  std::vector<std::optional<Error>> failed(jobs.size());
  std::size_t issuing = 0;  // the object whose pulls go out next
  // Chunks an asynchronous sink is writing while the next ones are read.
  rendezvous::HandedOver handed(executor, chunks_with_sink);
  // An object that fails (or a fetch that ends) stops asking: the answers
  // to its pulls still asked are dropped when they come.
  auto forget_asked = [&](std::optional<std::size_t> only_job) {
    std::erase_if(asked, [&](const Asked& behind) {
      if (only_job && behind.job != *only_job) return false;
      link->forget(behind.id);
      on_the_wire -= behind.len;
      return true;
    });
  };
  auto fail_unfinished = [&](const Error& why) {
    forget_asked(std::nullopt);
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      if (!failed[j] && received[j] < jobs[j].slice.length) failed[j] = why;
    }
  };
  // A sink that failed stops its object, as a wrong answer does.
  auto take_sink_failures = [&] {
    for (auto& [j, why] : handed.failures()) {
      if (failed[j]) continue;
      failed[j] = std::move(why);
      forget_asked(j);
    }
  };
  for (;;) {
    take_sink_failures();
    if (co_await cancelled_here()) {
      fail_unfinished(fetch_cancelled("during the chunked read"));
      break;
    }
    // One window for every object: the next object's first pulls go out
    // while the last of the one before are still on the wire.
    for (;;) {
      while (issuing < jobs.size() && (failed[issuing] || next[issuing] >= jobs[issuing].slice.end())) ++issuing;
      if (issuing == jobs.size()) break;
      const auto& job = jobs[issuing];
      const auto len = static_cast<std::uint32_t>(std::min<std::uint64_t>(job.chunk, job.slice.end() - next[issuing]));
      if (!asked.empty() && on_the_wire + len > window) break;
      // A pull into memory names where its answer lands: read there once.
      const auto landing = job.memory.empty() ? std::span<std::byte>{}
                                              : job.memory.subspan(next[issuing] - job.slice.offset, len);
      asked.push_back(
          Asked{link->send(Pull{job.lease, next[issuing], len}, landing, next[issuing]), issuing, next[issuing], len});
      next[issuing] += len;
      on_the_wire += len;
    }
    if (asked.empty()) break;
    const Asked pull = asked.front();
    asked.pop_front();
    on_the_wire -= pull.len;
    auto reply = co_await link->answer(pull.id);
    if (failed[pull.job]) continue;  // its sink failed meanwhile: the answer is dropped
    auto taken = take_chunk(pull.offset, pull.len, std::move(reply), jobs[pull.job], pull.job, handed);
    if (!taken) {
      failed[pull.job] = std::move(taken).error();
      forget_asked(pull.job);
      if (!link->is_open()) fail_unfinished(*failed[pull.job]);
      continue;
    }
    received[pull.job] += pull.len;
    if (config.on_progress) config.on_progress(received[pull.job], jobs[pull.job].slice.length);
    co_await handed.room();
  }
  // Answers still being read into the jobs' memory finish before it goes,
  // and the fetch ends only once its sinks have answered for every chunk.
  co_await link->landings_settled();
  co_await handed.all_back();
  take_sink_failures();
  std::vector<Result<void>> results;
  results.reserve(jobs.size());
  for (auto& why : failed) results.push_back(why ? Result<void>(std::move(*why)) : success());
  co_return results;
}

Result<void> Consumer::State::take_chunk(std::uint64_t offset, std::uint32_t len, Result<Message> reply,
                                         const PullJob& job, std::size_t index, rendezvous::HandedOver& handed) {
  CORMA_TRY(auto message, std::move(reply));
  auto* data = std::get_if<Data>(&message);
  const bool landed = data != nullptr && !job.memory.empty() && data->landed == len && data->bytes.empty();
  if (data == nullptr || data->offset != offset || (!landed && data->bytes.size() != len)) {
    Error wrong{errc::protocol, "owner answered a pull with the wrong bytes"};
    link->give_up(wrong);
    return wrong;
  }
  if (landed) return success();
  Result<void> written = success();
  if (job.memory.empty() && job.write.hands_over()) {
    // Its buffer comes back for the next answer once the sink is done.
    handed.hand(job.write, index, offset, std::move(data->bytes),
                [link = link](std::vector<std::byte> buffer) { link->recycle(std::move(buffer)); });
    return success();
  }
  if (job.memory.empty()) {
    written = job.write.write_in_place(offset, data->bytes);
  } else {
    std::memcpy(job.memory.data() + (offset - job.slice.offset), data->bytes.data(), len);
  }
  link->recycle(std::move(data->bytes));
  return written;
}

asio::awaitable<Result<void>> Consumer::State::release(std::uint64_t lease) {
  Release message{lease};
  auto answer = co_await request(message);
  if (answer || answer.error().code.category() != error_category()) co_return success();
  co_return release_verdict(static_cast<std::uint16_t>(answer.error().code.value()));
}

// ---- the RDMA path -------------------------------------------------------------------

asio::awaitable<std::optional<Error>> Consumer::State::run_transfer(const StartTransfer& start) {
  asio::steady_timer wake(executor, asio::steady_timer::time_point::max());
  asio::cancellation_signal cancel;
  bool answered = false;
  // Listed while it runs: a lost owner cancels it.
  struct Listed {
    std::set<asio::cancellation_signal*>& transfers;
    std::set<asio::cancellation_signal*>::iterator at;
    ~Listed() { transfers.erase(at); }
  } listed{transfers, transfers.insert(&cancel).first};
  start(cancel.slot(), [&answered, &wake] {
    answered = true;
    wake.cancel();
  });
  std::optional<Error> stopped;  // why the transfer was cancelled
  if (auto gone = lost()) {
    stopped = std::move(gone);
    cancel.emit(asio::cancellation_type::terminal);
  }
  while (!answered) {
    // Woken by the transfer's answer, or by the fetch's cancellation (the
    // owner's loss cancels the transfer, which then answers). Once stopped
    // the wait is deaf: only the transfer's own answer ends it.
    if (stopped) {
      (void)co_await wake.async_wait(asio::bind_cancellation_slot(asio::cancellation_slot(), as_result));
    } else {
      (void)co_await wake.async_wait(as_result);
    }
    if (answered || stopped) continue;
    if (auto gone = lost()) {
      stopped = std::move(gone);
    } else if (co_await cancelled_here()) {
      // The transfer is not cancelled but waited for: it reads the owner's
      // memory under the fetch's lease, and the lease must outlive it (a
      // transfer cancelled early would go on in the provider, and the lease
      // released now could let the owner free or reuse what it reads). A
      // transfer ends by itself or by the backend's operation deadline.
      stopped = fetch_cancelled("during the rdma get");
    }
  }
  if (!stopped) stopped = lost();
  co_return stopped;
}

asio::awaitable<Result<void>> Consumer::State::read_remote(const std::vector<std::byte>& descriptor_bytes,
                                                           std::uint64_t len, Slice part, RegionGuard& guard,
                                                           std::uint64_t offset) {
  CORMA_CO_TRY(auto remote, decode_descriptor(descriptor_bytes));
  if (remote.len != len) co_return fail(errc::protocol, "descriptor length differs from what was granted");
  if (!peer) co_return fail(errc::peer_unreachable, "no RDMA peer for this owner");
  if (part.length == 0) co_return success();  // nothing of it is wanted
  std::optional<Result<void>> got;
  const StartTransfer start = [&](asio::cancellation_slot slot, std::function<void()> answered) {
    guard.async_get(*peer, remote, TransferRange{offset, part.offset, part.length},
                    asio::bind_cancellation_slot(
                        slot, asio::bind_executor(executor, [&got, answered = std::move(answered)](Result<void> r) {
                          got = std::move(r);
                          answered();
                        })));
  };
  // A fetch stopped meanwhile (cancelled, or its owner lost) answers why,
  // even when the get itself got through.
  auto stopped = co_await run_transfer(start);
  if (stopped) co_return std::move(*stopped);
  co_return std::move(*got);
}

asio::awaitable<Result<void>> Consumer::State::read_windows(const RdmaWindow& first, Slice slice,
                                                            RegionGuard& guard, std::uint64_t base,
                                                            const rendezvous::Sink& sink, std::uint32_t& windows) {
  if (slice.length == 0) co_return success();
  RdmaWindow window = first;
  // A version 5 owner moves a window past bytes nobody asked for; an older
  // one only to where the current window ends.
  const bool skips = version >= generation_protocol_version;
  for (std::uint64_t expected = 0;;) {
    if (window.lease != first.lease || window.size != first.size || window.offset != expected ||
        window.generation != first.generation) {
      co_return fail(errc::protocol, "owner lent a window other than the next one");
    }
    const auto window_end = window.offset + window.window_len;
    // The part of this window the slice wants, in the object.
    const auto from = std::max(window.offset, slice.offset);
    const auto to = std::min(window_end, slice.end());
    if (from < to) {
      const Slice part{from - window.offset, to - from};
      CORMA_CO_TRY(co_await read_remote(window.descriptor, window.window_len, part, guard,
                                        base + (from - slice.offset)));
      ++windows;
      if (sink) {
        CORMA_CO_TRY(co_await sink.write(from, guard.bytes().subspan(base + (from - slice.offset), to - from)));
      }
      if (config.on_progress) config.on_progress(to - slice.offset, slice.length);
    }
    if (window_end >= slice.end()) co_return success();
    if (co_await cancelled_here()) co_return fetch_cancelled("between two windows");
    expected = skips ? std::max(window_end, slice.offset) : window_end;
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

std::optional<Consumer::State::KeyInUse> Consumer::State::imported_key(const PackedKey& packed) const {
  auto found = imported_keys.find(packed);
  if (found == imported_keys.end()) return std::nullopt;
  return KeyInUse{found->second.key, found->second.users};
}

asio::awaitable<Result<Consumer::State::KeyInUse>> Consumer::State::key_for(const PackedKey& packed) {
  if (auto found = imported_key(packed)) co_return std::move(*found);
  if (!peer) co_return fail(errc::peer_unreachable, "no RDMA peer for this owner");
  const auto backend = registry->backend();
  if (imported_keys.size() >= std::max<std::size_t>(config.max_imported_keys, 1)) {
    // Bounded: the keys of exports long gone would otherwise pile up. A key
    // a read is using (a set being read, or about to be) stays.
    std::erase_if(imported_keys, [&backend](const auto& entry) {
      if (entry.second.in_use()) return false;
      backend->async_release_key(entry.second.key, [](Result<void>) {});
      return true;
    });
  }
  CORMA_CO_TRY(auto key, co_await backend->async_import_key(*peer, packed, asio::use_awaitable));
  // Another fetch may have imported the same key meanwhile: one is kept,
  // the other let go, so that none is left imported with nobody to release it.
  auto [kept, inserted] = imported_keys.emplace(packed, ImportedKey{key});
  if (!inserted) backend->async_release_key(key, [](Result<void>) {});
  co_return KeyInUse{kept->second.key, kept->second.users};
}

// ---- fetches ----------------------------------------------------------------------------

asio::awaitable<Result<std::span<std::byte>>> Consumer::State::span_to_fill(const Destination& destination,
                                                                            std::uint64_t lease, std::uint64_t size) {
  auto into = destination.span_for(size);
  if (!into) (void)co_await release(lease);
  co_return into;
}

asio::awaitable<Result<FetchOutcome>> Consumer::State::fetch(std::string name, const Destination& destination,
                                                             ByteRange range) {
  CORMA_CO_TRY(check_object_name(name));
  Acquire acquire{name, peer.has_value()};
  CORMA_CO_TRY(auto reply, co_await request(std::move(acquire)));
  if (std::holds_alternative<NotFound>(reply)) {
    co_return fail(errc::region_not_found, "owner has no object named '" + name + "'");
  }
  FetchOutcome fetched;
  std::uint64_t lease = 0;
  std::uint32_t chunk = fallback_chunk;
  std::uint32_t lease_timeout_ms = 0;
  if (auto* chunked = std::get_if<Chunked>(&reply)) {
    lease = chunked->lease;
    fetched.size = chunked->size;
    fetched.reason = chunked->reason;
    chunk = chunked->chunk_size;
    lease_timeout_ms = chunked->lease_timeout_ms;
  } else if (auto* grant = std::get_if<RdmaGrant>(&reply)) {
    lease = grant->lease;
    fetched.size = grant->size;
    lease_timeout_ms = grant->lease_timeout_ms;
  } else if (auto* window = std::get_if<RdmaWindow>(&reply)) {
    lease = window->lease;
    fetched.size = window->size;
    lease_timeout_ms = window->lease_timeout_ms;
  } else {
    co_return fail(errc::protocol, "owner answered an acquire with something else");
  }
  const auto* grant = std::get_if<RdmaGrant>(&reply);
  const auto* window = std::get_if<RdmaWindow>(&reply);
  fetched.generation = generation_of(reply);
  // Renewed with the connection's other leases until it is released.
  const auto kept = leases->keep(lease, lease_timeout_ms);
  if (co_await cancelled_here()) {
    (void)co_await release(lease);
    co_return fetch_cancelled("after the owner granted it");
  }
  auto sliced = slice_of(range, fetched.size);
  if (!sliced) {
    (void)co_await release(lease);
    co_return std::move(sliced).error();
  }
  const Slice slice = sliced.value();
  fetched.offset = slice.offset;
  fetched.length = slice.length;
  // A streamed chunked fetch needs no memory of its own.
  Result<std::span<std::byte>> into = std::span<std::byte>{};
  const bool rdma_granted = (grant != nullptr || window != nullptr) && slice.length > 0;
  if (!destination.sink || rdma_granted || destination.chunks_to_memory) {
    into = co_await span_to_fill(destination, lease, slice.length);
    if (!into) co_return std::move(into).error();
  }
  if (slice.length == 0) {
    // Nothing to move: the lease said the object's size and goes back.
    CORMA_CO_TRY(co_await release(lease));
    fetched.path = fetched.reason ? Path::chunked : Path::rdma;
    co_return fetched;
  }

  if (rdma_granted) {
    // Windows go to the sink one by one as they land; a whole grant after
    // (unless they landed where they belong).
    rendezvous::Sink rdma_sink = destination.rdma_lands_for_good ? rendezvous::Sink{} : destination.sink;
    const ReadInto read = [&](RegionGuard& guard, std::uint64_t base) {
      return grant != nullptr ? read_remote(grant->descriptor, grant->size, slice, guard, base)
                              : read_windows(*window, slice, guard, base, rdma_sink, fetched.windows);
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
        spare = OwnedBuffer::allocate(std::max<std::uint64_t>(slice.length, 1));
        into = spare.bytes().first(slice.length);
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
    if (got && rdma_sink && grant != nullptr) got = co_await rdma_sink.write(slice.offset, into.value().first(slice.length));
    // The owner let the lease lapse during the read: the bytes may have
    // been let go meanwhile, and no chunks can follow on it.
    if (auto lapsed = kept.lost()) {
      (void)co_await release(lease);
      co_return std::move(*lapsed);
    }
    if (got) {
      if (config.on_progress && grant != nullptr) config.on_progress(slice.length, slice.length);
      fetched.path = Path::rdma;
      CORMA_CO_TRY(co_await release(lease));
      ++stats.decisions.rdma;
      co_return fetched;
    }
    // No fallback from a lost owner: its chunks would come over the
    // connection that just ended (and the lease died with it).
    if (auto gone = lost()) co_return std::move(*gone);
    if (co_await cancelled_here()) {
      (void)co_await release(lease);
      co_return std::move(got).error();
    }
    // Exactly one fallback: the chunked path on the same lease, into
    // fresh memory when the failed get's memory was taken over.
    fetched.reason = ChunkedReason::rdma_failed;
    fetched.failure = got.error().message();
    ++stats.fallbacks;
    if (destination.registered == nullptr && !destination.sink) {
      into = co_await span_to_fill(destination, lease, slice.length);
      if (!into) co_return std::move(into).error();
    }
  }
  // Streamed to the sink, or read straight into the destination's memory.
  // (After a failed RDMA read, memory the read was given is not used again:
  // a sink's fallback goes to the sink.)
  PullJob job{lease, slice, chunk, destination.sink, {}};
  if (!destination.sink || (destination.chunks_to_memory && !rdma_granted)) job.memory = into.value();
  auto pulled = co_await pull_all(std::move(job));
  if (!pulled) {
    (void)co_await release(lease);  // answered at once: the owner has the lease back when the fetch ends
    co_return std::move(pulled).error();
  }
  CORMA_CO_TRY(co_await release(lease));
  fetched.path = Path::chunked;
  ++stats.decisions.chunked_by_reason[std::string(to_string(*fetched.reason))];
  co_return fetched;
}

asio::awaitable<Result<void>> Consumer::State::prove_owner() {
  if (config.cluster_key.size() < min_cluster_key_size) {
    co_return fail(errc::not_configured,
                   "a cluster key has at least " + std::to_string(min_cluster_key_size) + " bytes");
  }
  if (config.protocol_version < proof_protocol_version) {
    co_return fail(errc::not_configured, "an owner's proof needs protocol version " +
                                             std::to_string(proof_protocol_version));
  }
  CORMA_CO_TRY(auto challenge, fresh_challenge());
  auto reply = co_await request(Prove{challenge});
  const auto refused = [this](const std::string& why) {
    return Error{errc::not_owned, "the owner" + (config.expected_owner.empty() ? "" : " '" + config.expected_owner + "'") +
                                      " did not prove it holds the cluster key: " + why};
  };
  if (!reply) co_return refused(reply.error().message());
  auto* proof = std::get_if<Proof>(&reply.value());
  if (proof == nullptr) co_return refused("it answered something else");
  const auto key = std::as_bytes(std::span{config.cluster_key.data(), config.cluster_key.size()});
  // Checked for the address this side dialled: a proof a real owner gave
  // for its own address, relayed by whoever sits at this one, fails here.
  if (!proof_holds(key, challenge, *proof, proof_endpoint(dialled))) {
    co_return refused("its proof as '" + printable(proof->owner_id) + "' is wrong for " + proof_endpoint(dialled));
  }
  if (!config.expected_owner.empty() && proof->owner_id != config.expected_owner) {
    co_return refused("it proved to be '" + printable(proof->owner_id) + "'");
  }
  proven_owner = proof->owner_id;
  co_return success();
}

asio::awaitable<Result<void>> Consumer::State::hello() {
  // With a cluster key, nothing of this side's (its RDMA offer, later its
  // push keys) goes to an owner before it proved who it is.
  if (!config.cluster_key.empty()) {
    CORMA_CO_TRY(co_await prove_owner());
  }
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
  // A peer offered and not taken (the owner declined RDMA, its answer was
  // refused, the hello failed) is closed, not left with the backend (a
  // queue pair, on verbs).
  struct ClosedUnlessTaken {
    std::optional<PeerId>& pending;
    const std::optional<PeerId>& taken;
    const std::shared_ptr<Registry>& registry;
    ~ClosedUnlessTaken() {
      if (pending && pending != taken) registry->backend()->async_peer_close(*pending, [](Result<void>) {});
    }
  } close_unless_taken{pending, peer, registry};
  CORMA_CO_TRY(auto reply, co_await request(std::move(hello)));
  auto* ok = std::get_if<HelloOk>(&reply);
  if (ok == nullptr) co_return fail(errc::protocol, "owner did not answer hello");
  if (ok->version < oldest_protocol_version || ok->version > offered_version) {
    co_return fail(errc::protocol, "owner answered with protocol version " + std::to_string(ok->version));
  }
  version = ok->version;
  max_batch = std::max<std::uint16_t>(ok->max_batch, 1);
  if (version >= heartbeat_protocol_version) {
    leases->use_heartbeat();
    link->set_probe(Heartbeat{});
  }
  if (pending && ok->backend == offered && !ok->peer_answer.empty()) {
    auto completed = co_await registry->backend()->async_peer_complete(*pending, std::move(ok->peer_answer),
                                                                      asio::use_awaitable);
    if (completed) peer = pending;
  }
  co_return success();
}

}  // namespace corma
