// Consumer::async_fetch_many: a set of objects in batches of the owner's
// limit (protocol version 2). Each batch is one acquire_many, one seam batch
// reading every RDMA grant (its leases renewed meanwhile), pulls for the
// rest, and one release_many; the batches are pipelined, so the next
// batch's acquire and the previous one's release travel while this one's
// bytes move.
#include "rendezvous/consumer/consumer_state.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

namespace {

/// Names per acquire_many frame are also bounded by bytes: well under the
/// owner's frame limit, whatever the names' lengths.
constexpr std::size_t batch_name_bytes = 512 * 1024;

/// One object of a batch the owner granted (a lease to release).
struct Leased {
  std::size_t index = 0;  ///< in the caller's names
  std::uint64_t lease = 0;
  std::uint32_t chunk = fallback_chunk;
  const RdmaGrant* rdma = nullptr;  ///< the grant, while an RDMA read is still to be tried
  const RdmaWindow* window = nullptr;  ///< the first window of an object lent in windows
  FetchOutcome outcome;
  Slice slice;                      ///< the bytes of it its slot asks for
  std::optional<Error> failed;      ///< set once the object has failed
  bool needs_chunks = false;
};

/// One batch on its way: the objects it names, the request that acquired
/// them and its answer, what was granted, and the request releasing them.
struct Batch {
  std::vector<std::size_t> indices;
  std::uint64_t acquire = 0;
  Granted granted;
  std::vector<Leased> leased;
  /// The leases granted, renewed with the connection's others until the
  /// batch is released.
  std::vector<LeaseKeeper::Ticket> kept;
  std::optional<std::uint64_t> release;
};

Result<void> check_slot(const FetchSlot& slot) {
  if (slot.region == nullptr || !*slot.region) return fail(errc::region_not_found, "destination is not registered");
  return validate_slice(slot.offset, slot.capacity, slot.region->size());
}

/// One async_fetch_many, run by Consumer::State::fetch_many.
class ManyFetch {
 public:
  ManyFetch(Consumer::State& state, std::vector<std::string> names, std::vector<FetchSlot> slots)
      : s_(state), names_(std::move(names)), slots_(std::move(slots)), outcomes_(names_.size(), not_fetched()) {}

  asio::awaitable<ManyFetched> run() {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      auto checked = check_object_name(names_[i]);
      if (checked) checked = check_slot(slots_[i]);
      if (checked) {
        pending_.push_back(i);
      } else {
        outcomes_[i] = std::move(checked).error();
      }
    }
    if (s_.version < batch_protocol_version) {
      co_await one_at_a_time();
    } else {
      co_await in_batches();
    }
    co_return std::move(outcomes_);
  }

 private:
  static Result<FetchOutcome> not_fetched() { return fail(errc::cancelled, "not fetched"); }

  /// An owner without batches: one object after the other.
  asio::awaitable<void> one_at_a_time() {
    for (; next_ < pending_.size(); ++next_) {
      if (co_await cancelled_here()) break;
      const auto i = pending_[next_];
      const auto destination = registered_destination(*slots_[i].region, slots_[i].offset, slots_[i].capacity);
      outcomes_[i] = co_await s_.fetch(names_[i], destination, slots_[i].range);
    }
    fail_rest(fetch_cancelled("before its turn"));
  }

  asio::awaitable<void> in_batches() {
    std::optional<Batch> current = co_await send_next_acquire();
    std::optional<Batch> previous;
    while (current && !ended_) {
      co_await take_grants(*current);
      std::optional<Batch> next;
      if (!ended_ && co_await cancelled_here()) ended_ = fetch_cancelled("before its batch");
      if (!ended_) next = co_await send_next_acquire();
      co_await read(*current);
      co_await send_release(*current);
      if (previous) co_await finish(*previous);
      previous = std::move(current);
      current = std::move(next);
    }
    if (current) {
      // Acquired but not read (the fetch ended): its leases still go back.
      co_await take_grants(*current);
      for (auto& object : current->leased) object.failed = object.failed.value_or(*ended_);
      co_await send_release(*current);
    }
    if (previous) co_await finish(*previous);
    if (current) co_await finish(*current);
    fail_rest(ended_.value_or(fetch_cancelled("before its batch")));
  }

  /// Every object not yet asked for ends with `error`.
  void fail_rest(const Error& error) {
    for (; next_ < pending_.size(); ++next_) outcomes_[pending_[next_]] = error;
  }

  /// Asks for the next batch: up to the owner's limit, within one frame.
  asio::awaitable<std::optional<Batch>> send_next_acquire() {
    if (next_ >= pending_.size()) co_return std::nullopt;
    Batch batch;
    AcquireMany acquire;
    acquire.wants_rdma = s_.peer.has_value();
    std::size_t bytes = 0;
    while (next_ < pending_.size() && batch.indices.size() < s_.max_batch) {
      const auto& name = names_[pending_[next_]];
      if (!batch.indices.empty() && bytes + name.size() + 2 > batch_name_bytes) break;
      bytes += name.size() + 2;
      acquire.names.push_back(name);
      batch.indices.push_back(pending_[next_++]);
    }
    batch.acquire = s_.link->send(std::move(acquire));
    co_return batch;
  }

  void fail_batch(const Batch& batch, const Error& error) {
    for (auto i : batch.indices) outcomes_[i] = error;
  }

  /// Reads the owner's answer to a batch's acquire: what it granted, what it
  /// has not, and what does not fit its slot (leased all the same, released
  /// with the rest).
  asio::awaitable<void> take_grants(Batch& batch) {
    auto reply = co_await s_.link->answer(batch.acquire);
    if (!reply) {
      fail_batch(batch, reply.error());
      // An owner refusing the batch (its limits) keeps the connection.
      if (!s_.link->is_open()) ended_ = std::move(reply).error();
      co_return;
    }
    auto* granted = std::get_if<Granted>(&reply.value());
    if (granted == nullptr || granted->grants.size() != batch.indices.size()) {
      ended_ = Error{errc::protocol, "owner answered acquire_many with something else"};
      s_.link->give_up(*ended_);
      fail_batch(batch, *ended_);
      co_return;
    }
    batch.granted = std::move(*granted);
    for (std::size_t k = 0; k < batch.indices.size(); ++k) {
      const auto i = batch.indices[k];
      const auto& grant = batch.granted.grants[k];
      Leased object;
      object.index = i;
      if (std::holds_alternative<NotFound>(grant)) {
        outcomes_[i] = fail(errc::region_not_found, "owner has no object named '" + names_[i] + "'");
        continue;
      }
      if (auto* error = std::get_if<ErrorReply>(&grant)) {
        outcomes_[i] = from_reply(*error);
        continue;
      }
      if (auto* chunked = std::get_if<Chunked>(&grant)) {
        object.lease = chunked->lease;
        object.chunk = chunked->chunk_size;
        object.outcome.size = chunked->size;
        object.outcome.reason = chunked->reason;
        object.needs_chunks = true;
        batch.kept.push_back(s_.leases->keep(chunked->lease, chunked->lease_timeout_ms));
      } else if (auto* window = std::get_if<RdmaWindow>(&grant)) {
        object.lease = window->lease;
        object.window = window;
        object.outcome.size = window->size;
        batch.kept.push_back(s_.leases->keep(window->lease, window->lease_timeout_ms));
      } else {
        const auto& rdma = std::get<RdmaGrant>(grant);
        object.lease = rdma.lease;
        object.rdma = &rdma;
        object.outcome.size = rdma.size;
        batch.kept.push_back(s_.leases->keep(rdma.lease, rdma.lease_timeout_ms));
      }
      object.outcome.generation = grant_generation(grant);
      // Leased all the same when the range or the slot is wrong: released with the rest.
      if (auto sliced = slice_of(slots_[i].range, object.outcome.size); !sliced) {
        object.failed = std::move(sliced).error();
      } else if (object.slice = sliced.value(); object.slice.length > slots_[i].capacity) {
        object.failed = Error{errc::out_of_range, "object of " + std::to_string(object.slice.length) +
                                                      " bytes does not fit its " +
                                                      std::to_string(slots_[i].capacity) + "-byte destination"};
      }
      object.outcome.offset = object.slice.offset;
      object.outcome.length = object.slice.length;
      batch.leased.push_back(std::move(object));
    }
  }

  /// Moves a granted batch's bytes: every RDMA grant in one seam batch,
  /// then chunks for the objects served in chunks and those whose RDMA read
  /// failed (exactly one fallback each).
  asio::awaitable<void> read(Batch& batch) {
    co_await read_rdma(batch);
    for (auto& object : batch.leased) co_await read_windows(object);
    std::vector<Leased*> chunked;
    std::vector<Consumer::State::PullJob> jobs;
    for (auto& object : batch.leased) {
      if (object.failed || !object.needs_chunks) continue;
      if (ended_) {
        object.failed = ended_;
        continue;
      }
      const auto& slot = slots_[object.index];
      chunked.push_back(&object);
      jobs.push_back(Consumer::State::PullJob{object.lease, object.slice, object.chunk, {},
                                              slot.region->bytes().subspan(slot.offset, object.slice.length)});
    }
    if (jobs.empty()) co_return;
    auto pulled = co_await s_.pull_objects(std::move(jobs));
    for (std::size_t k = 0; k < chunked.size(); ++k) {
      auto& object = *chunked[k];
      if (pulled[k]) {
        object.outcome.path = Path::chunked;
        continue;
      }
      object.failed = pulled[k].error();
      if (pulled[k].error().is(errc::cancelled) || !s_.link->is_open()) ended_ = pulled[k].error();
    }
  }

  asio::awaitable<void> read_rdma(Batch& batch) {
    std::vector<BatchedGet> gets;
    std::vector<Leased*> reading;
    // The keys the gets name stay imported until the batch has ended.
    std::vector<std::shared_ptr<const void>> keys_in_use;
    for (auto& object : batch.leased) {
      if (object.failed) continue;
      if (ended_) {
        object.failed = ended_;
        continue;
      }
      if (object.rdma == nullptr) continue;
      if (object.slice.length == 0) {  // nothing of it to read
        object.rdma = nullptr;
        object.outcome.path = Path::rdma;
        continue;
      }
      std::optional<Error> refused;
      auto remote = remote_of(object);
      std::optional<Consumer::State::KeyInUse> key;
      if (!remote) {
        refused = remote.error();
      } else if (key = s_.imported_key(remote.value().packed_key); !key) {
        // Its key is not imported yet: the only step of a read that waits
        // (a warm set reads its objects without a coroutine each).
        auto imported = co_await s_.key_for(remote.value().packed_key);
        if (imported) {
          key = std::move(imported).value();
        } else {
          refused = std::move(imported).error();
        }
      }
      if (refused) {
        object.needs_chunks = true;
        object.outcome.reason = ChunkedReason::rdma_failed;
        object.outcome.failure = refused->message();
        continue;
      }
      gets.push_back(batched_get(object, std::move(remote).value(), std::move(*key), keys_in_use));
      reading.push_back(&object);
    }
    if (gets.empty()) co_return;
    std::optional<Result<BatchOutcome>> got;
    const Consumer::State::StartTransfer start = [&](asio::cancellation_slot slot, std::function<void()> answered) {
      RegionGuard::async_get_batch(
          *s_.peer, std::move(gets),
          asio::bind_cancellation_slot(
              slot, asio::bind_executor(s_.executor, [&got, answered = std::move(answered)](Result<BatchOutcome> r) {
                got = std::move(r);
                answered();
              })));
    };
    auto stopped = co_await s_.run_transfer(start);
    // Which reads failed: all of them when the batch itself did, and when
    // the set was cancelled or the owner lost while they ran (the rule of a
    // single fetch: what was read then is not answered as fetched).
    std::vector<std::optional<Error>> failed(reading.size());
    if (stopped) {
      std::fill(failed.begin(), failed.end(), *stopped);
      ended_ = std::move(stopped);
    } else if (!*got) {
      std::fill(failed.begin(), failed.end(), got->error());
    } else {
      for (auto& failure : got->value().failures) failed[failure.index] = std::move(failure.error);
    }
    for (std::size_t r = 0; r < reading.size(); ++r) {
      auto& object = *reading[r];
      object.rdma = nullptr;
      if (!failed[r]) {
        object.outcome.path = Path::rdma;
      } else if (ended_) {
        object.failed = ended_;
      } else {
        object.needs_chunks = true;
        object.outcome.reason = ChunkedReason::rdma_failed;
        object.outcome.failure = failed[r]->message();
      }
    }
  }

  /// An object lent in windows, one window after the other (the owner
  /// lends them one at a time).
  asio::awaitable<void> read_windows(Leased& object) {
    if (object.window == nullptr || object.failed) co_return;
    const auto* first = std::exchange(object.window, nullptr);
    if (ended_) {
      object.failed = ended_;
      co_return;
    }
    const auto& slot = slots_[object.index];
    auto got = co_await s_.read_windows(*first, object.slice, *slot.region, slot.offset, {}, object.outcome.windows);
    if (got) {
      object.outcome.path = Path::rdma;
    } else if (s_.lost() || got.error().is(errc::cancelled)) {
      ended_ = s_.lost().value_or(got.error());
      object.failed = ended_;
    } else {
      object.needs_chunks = true;
      object.outcome.reason = ChunkedReason::rdma_failed;
      object.outcome.failure = got.error().message();
    }
  }

  /// The remote region `object`'s grant names.
  static Result<RemoteRegion> remote_of(const Leased& object) {
    CORMA_TRY(auto remote, decode_descriptor(object.rdma->descriptor));
    if (remote.len != object.outcome.size) return fail(errc::protocol, "descriptor length differs from the object size");
    return remote;
  }

  /// The seam batch element reading `object` (in `remote`) into its slot
  /// through `key`, which stays in use (`keys_in_use`) until the batch ended.
  BatchedGet batched_get(const Leased& object, RemoteRegion remote, Consumer::State::KeyInUse key,
                         std::vector<std::shared_ptr<const void>>& keys_in_use) const {
    keys_in_use.push_back(std::move(key.hold));
    remote.packed_key.clear();  // the imported key names it
    const auto& slot = slots_[object.index];
    return BatchedGet{slot.region, std::move(remote),
                      TransferRange{slot.offset, object.slice.offset, object.slice.length}, key.key};
  }

  /// Hands a batch's leases back in one request (its answer is read by
  /// finish(), once the next batch is under way).
  asio::awaitable<void> send_release(Batch& batch) {
    if (batch.leased.empty() || !s_.link->is_open()) co_return;
    ReleaseMany message;
    for (const auto& object : batch.leased) message.leases.push_back(object.lease);
    batch.release = s_.link->send(std::move(message));
  }

  /// Settles a batch's outcomes once its release is answered. The owner
  /// names each object published again while it was read (`object_changed`):
  /// those fail; any other trouble with the answer (the owner lost after
  /// the batch was read, say) says nothing about the bytes, as for a single
  /// fetch.
  asio::awaitable<void> finish(Batch& batch) {
    std::vector<std::uint16_t> codes;
    if (batch.release) {
      auto reply = co_await s_.link->answer(*batch.release);
      auto* released = reply ? std::get_if<ReleasedMany>(&reply.value()) : nullptr;
      if (released != nullptr && released->codes.size() == batch.leased.size()) {
        codes = std::move(released->codes);
      } else if (reply) {
        // An answer that names other leases than were released (or is no
        // released_many at all): the owner is out of step.
        Error wrong{errc::protocol, "owner answered release_many with something other than one code per lease"};
        s_.link->give_up(wrong);
        for (auto& object : batch.leased) {
          if (!object.failed) object.failed = wrong;
        }
      }
    }
    for (std::size_t k = 0; k < batch.leased.size(); ++k) {
      auto& object = batch.leased[k];
      // The rules of a single fetch (consumer_state.cpp): a lease that
      // lapsed while it was read, or that the owner no longer held when it
      // was released, proves nothing; one published again fails.
      if (!object.failed) {
        if (auto lapsed = batch.kept[k].lost()) object.failed = std::move(lapsed);
      }
      if (!object.failed && !codes.empty()) {
        if (auto verdict = release_verdict(codes[k]); !verdict) object.failed = std::move(verdict).error();
      }
      if (object.failed) {
        outcomes_[object.index] = *object.failed;
        continue;
      }
      if (object.outcome.path == Path::rdma) {
        ++s_.stats.decisions.rdma;
      } else {
        ++s_.stats.decisions.chunked_by_reason[std::string(to_string(*object.outcome.reason))];
      }
      if (object.outcome.fell_back()) ++s_.stats.fallbacks;
      outcomes_[object.index] = std::move(object.outcome);
    }
  }

  Consumer::State& s_;
  std::vector<std::string> names_;
  std::vector<FetchSlot> slots_;
  ManyFetched outcomes_;
  std::vector<std::size_t> pending_;  ///< objects with a valid name and slot, in order
  std::size_t next_ = 0;              ///< the first of pending_ not yet asked for
  /// Why the fetch stopped short (cancelled, connection or owner lost).
  std::optional<Error> ended_;
};

}  // namespace

asio::awaitable<ManyFetched> Consumer::State::fetch_many(std::vector<std::string> names,
                                                         std::vector<FetchSlot> slots) {
  ManyFetch fetch(*this, std::move(names), std::move(slots));
  co_return co_await fetch.run();
}

}  // namespace corma
