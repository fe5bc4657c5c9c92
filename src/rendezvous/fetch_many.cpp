// Consumer::async_fetch_many: a set of objects in batches of the owner's
// limit, three round trips per batch (acquire_many, the RDMA batch read with
// its renewals, release_many) instead of three per object.
#include "consumer_state.hpp"

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
  FetchOutcome outcome;
  std::optional<Error> failed;      ///< set once the object has failed
  bool needs_chunks = false;
};

Result<void> check_slot(const FetchSlot& slot) {
  if (slot.region == nullptr || !*slot.region) return fail(errc::region_not_found, "destination is not registered");
  return validate_slice(slot.offset, slot.capacity, slot.region->size());
}

/// The objects at `indices` from `from` on all end with `error`.
void fail_from(ManyFetched& outcomes, std::span<const std::size_t> indices, std::size_t from, const Error& error) {
  for (std::size_t k = from; k < indices.size(); ++k) outcomes[indices[k]] = error;
}

}  // namespace

asio::awaitable<ManyFetched> Consumer::State::fetch_many(std::vector<std::string> names,
                                                         std::vector<FetchSlot> slots) {
  ManyFetched outcomes(names.size(), fail(errc::cancelled, "not fetched"));
  std::vector<std::size_t> pending;  // objects with a valid name and slot, in order
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto checked = check_name(names[i]);
    if (checked) checked = check_slot(slots[i]);
    if (checked) {
      pending.push_back(i);
    } else {
      outcomes[i] = std::move(checked).error();
    }
  }
  std::size_t next = 0;
  while (next < pending.size()) {
    if (co_await cancelled_here()) {
      fail_from(outcomes, pending, next, fetch_cancelled("before its batch"));
      break;
    }
    if (version < batch_protocol_version) {
      // An owner without batches: one object at a time.
      const auto i = pending[next++];
      const auto destination = registered_destination(*slots[i].region, slots[i].offset, slots[i].capacity);
      outcomes[i] = co_await fetch(names[i], destination);
      continue;
    }
    std::vector<std::size_t> batch;
    std::size_t bytes = 0;
    while (next < pending.size() && batch.size() < max_batch) {
      const auto size = names[pending[next]].size() + 2;
      if (!batch.empty() && bytes + size > batch_name_bytes) break;
      bytes += size;
      batch.push_back(pending[next++]);
    }
    auto fetched = co_await fetch_batch(batch, names, slots, outcomes);
    if (!fetched) {
      // The connection, the owner or the operation ended: nothing more is asked.
      fail_from(outcomes, pending, next, fetched.error());
      break;
    }
  }
  co_return outcomes;
}

asio::awaitable<Result<void>> Consumer::State::fetch_batch(std::span<const std::size_t> batch,
                                                           const std::vector<std::string>& names,
                                                           const std::vector<FetchSlot>& slots,
                                                           ManyFetched& outcomes) {
  AcquireMany acquire;
  acquire.wants_rdma = peer.has_value();
  for (auto i : batch) acquire.names.push_back(names[i]);
  auto reply = co_await request(std::move(acquire));
  if (!reply) {
    fail_from(outcomes, batch, 0, reply.error());
    // The owner refused the batch (its limits) but kept the connection: the
    // next batch may do better.
    if (connection && connection->is_open()) co_return success();
    co_return std::move(reply).error();
  }
  auto* granted = std::get_if<Granted>(&reply.value());
  if (granted == nullptr || granted->grants.size() != batch.size()) {
    connection->close();
    Error wrong{errc::protocol, "owner answered acquire_many with something else"};
    fail_from(outcomes, batch, 0, wrong);
    co_return wrong;
  }

  // ---- what the owner granted -----------------------------------------------------
  std::vector<Leased> leased;
  std::uint32_t lease_timeout_ms = 0xffffffffU;
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const auto i = batch[k];
    auto& grant = granted->grants[k];
    Leased object;
    object.index = i;
    if (std::holds_alternative<NotFound>(grant)) {
      outcomes[i] = fail(errc::region_not_found, "owner has no object named '" + names[i] + "'");
      continue;
    }
    if (auto* error = std::get_if<ErrorReply>(&grant)) {
      outcomes[i] = from_reply(*error);
      continue;
    }
    if (auto* chunked = std::get_if<Chunked>(&grant)) {
      object.lease = chunked->lease;
      object.chunk = chunked->chunk_size;
      object.outcome.size = chunked->size;
      object.outcome.reason = to_string(chunked->reason);
      object.needs_chunks = true;
      lease_timeout_ms = std::min(lease_timeout_ms, chunked->lease_timeout_ms);
    } else {
      const auto& rdma = std::get<RdmaGrant>(grant);
      object.lease = rdma.lease;
      object.rdma = &rdma;
      object.outcome.size = rdma.size;
      lease_timeout_ms = std::min(lease_timeout_ms, rdma.lease_timeout_ms);
    }
    if (object.outcome.size > slots[i].capacity) {
      object.failed = Error{errc::out_of_range, "object of " + std::to_string(object.outcome.size) +
                                                    " bytes does not fit its " + std::to_string(slots[i].capacity) +
                                                    "-byte destination"};
    }
    leased.push_back(std::move(object));
  }

  // ---- every RDMA grant in one seam batch --------------------------------------------
  std::optional<Error> ended;  // why the batch stopped short (cancelled, owner lost)
  if (co_await cancelled_here()) ended = fetch_cancelled("after the owner granted it");
  std::vector<BatchedGet> gets;
  std::vector<Leased*> read;
  for (auto& object : leased) {
    if (object.failed) continue;
    if (ended) {
      object.failed = ended;
      continue;
    }
    if (object.rdma == nullptr) continue;
    auto descriptor = decode_descriptor(object.rdma->descriptor);
    Result<RemoteKeyId> key = fail(errc::protocol, "descriptor length differs from the object size");
    if (!descriptor) {
      key = std::move(descriptor).error();
    } else if (descriptor.value().len == object.outcome.size) {
      key = co_await key_for(descriptor.value().packed_key);
    }
    if (!key) {
      object.needs_chunks = true;
      object.outcome.fell_back = true;
      object.outcome.reason = "rdma failed: " + key.error().message();
      continue;
    }
    auto remote = to_remote_region(descriptor.value());
    remote.packed_key.clear();  // the imported key names it
    const auto& slot = slots[object.index];
    gets.push_back(BatchedGet{slot.region, std::move(remote), TransferRange{slot.offset, 0, object.outcome.size},
                              key.value()});
    read.push_back(&object);
  }
  if (!gets.empty()) {
    std::optional<Result<BatchOutcome>> got;
    const StartTransfer start = [&](asio::cancellation_slot slot, std::function<void()> answered) {
      RegionGuard::async_get_batch(
          *peer, std::move(gets),
          asio::bind_cancellation_slot(slot, asio::bind_executor(executor, [&got, answered = std::move(answered)](
                                                                               Result<BatchOutcome> outcome) {
                                         got = std::move(outcome);
                                         answered();
                                       })));
    };
    std::vector<std::uint64_t> reading;
    for (const auto* object : read) reading.push_back(object->lease);
    ended = co_await supervise_transfer(reading, lease_timeout_ms, start);
    // Which reads failed: all of them when the batch itself did.
    std::vector<std::optional<Error>> read_failed(read.size());
    if (!*got) {
      std::fill(read_failed.begin(), read_failed.end(), got->error());
    } else {
      for (auto& failure : got->value().failures) read_failed[failure.index] = std::move(failure.error);
    }
    for (std::size_t r = 0; r < read.size(); ++r) {
      auto& object = *read[r];
      object.rdma = nullptr;
      if (!read_failed[r]) {
        object.outcome.path = Path::rdma;
      } else if (ended) {
        object.failed = ended;
      } else {
        // Exactly one fallback: this object's chunks, on the same lease.
        object.needs_chunks = true;
        object.outcome.fell_back = true;
        object.outcome.reason = "rdma failed: " + read_failed[r]->message();
      }
    }
  }
  // No chunks, and no release, from a lost owner: its connection ended.
  if (owner_lost) {
    for (auto& object : leased) outcomes[object.index] = object.failed.value_or(*owner_lost);
    co_return *owner_lost;
  }

  // ---- chunks for the rest -------------------------------------------------------------
  for (auto& object : leased) {
    if (object.failed || !object.needs_chunks) continue;
    if (ended) {
      object.failed = ended;
      continue;
    }
    const auto& slot = slots[object.index];
    const auto write = copy_into(slot.region->bytes().subspan(slot.offset, object.outcome.size));
    auto pulled = co_await pull_all(object.lease, object.outcome.size, object.chunk, write);
    if (pulled) {
      object.outcome.path = Path::chunked;
      continue;
    }
    object.failed = pulled.error();
    if (pulled.error().is(errc::cancelled) || !connection->is_open()) ended = pulled.error();
  }

  // ---- one release for the batch ---------------------------------------------------------
  std::vector<std::uint64_t> leases;
  for (const auto& object : leased) leases.push_back(object.lease);
  auto released = co_await release_many(std::move(leases));
  for (auto& object : leased) {
    if (object.failed) {
      outcomes[object.index] = *object.failed;
      continue;
    }
    if (released && released.value()[static_cast<std::size_t>(&object - leased.data())] ==
                        static_cast<std::uint16_t>(errc::object_changed)) {
      outcomes[object.index] = Error{errc::object_changed, "owner: the object was published again during the lease"};
      continue;
    }
    if (object.outcome.path == Path::rdma) {
      ++stats.decisions.rdma;
    } else {
      ++stats.decisions.chunked_by_reason[object.outcome.fell_back ? "rdma_failed" : object.outcome.reason];
    }
    if (object.outcome.fell_back) ++stats.fallbacks;
    outcomes[object.index] = std::move(object.outcome);
  }
  if (ended) co_return *ended;
  if (!released && !connection->is_open()) co_return std::move(released).error();
  co_return success();
}

asio::awaitable<Result<std::vector<std::uint16_t>>> Consumer::State::release_many(std::vector<std::uint64_t> leases) {
  if (leases.empty()) co_return std::vector<std::uint16_t>{};
  const auto count = leases.size();
  ReleaseMany message{std::move(leases)};
  CORMA_CO_TRY(auto reply, co_await request(std::move(message)));
  auto* answered = std::get_if<ReleasedMany>(&reply);
  if (answered == nullptr || answered->codes.size() != count) {
    co_return fail(errc::protocol, "owner answered release_many with something else");
  }
  co_return std::move(answered->codes);
}

}  // namespace corma
