// Objects and leases: acquires (single and batched), pulls, renewals,
// releases, and the reaper of abandoned leases.
#include "rendezvous/owner/owner_state.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

Result<PublishedObject> Owner::State::find(std::string_view name) {
  if (const auto* object = publications.find(name)) return *object;
  if (resolver) return resolver(name);
  return fail(errc::region_not_found, "no object named '" + std::string(name) + "'");
}

std::optional<Error> Owner::State::lease_cap_refusal(std::uint64_t session) const {
  const auto held = leases.places_of(session);
  if (held >= config.max_leases_per_connection) return Error{errc::budget_exceeded, "too many leases on this connection"};
  const auto total = leases.places();
  if (total >= config.max_leases) {
    return Error{errc::budget_exceeded,
                 "the owner holds its maximum of " + std::to_string(config.max_leases) + " leases"};
  }
  // The upper half of the owner's leases is shared out: a few greedy
  // connections cannot fill the cap and leave a newcomer nothing.
  const auto share = std::max<std::size_t>(config.max_leases / (2 * std::max<std::size_t>(connections.size(), 1)), 1);
  if (total >= config.max_leases / 2 && held >= share) {
    return Error{errc::budget_exceeded, "the owner is more than half full of leases and this connection holds its "
                                        "share (" + std::to_string(share) + ")"};
  }
  return std::nullopt;
}

bool Owner::State::republished_since(const Lease& lease) const {
  return lease.publication && publications.publication_of(lease.name) != *lease.publication;
}

Owner::State::PreparedAcquire Owner::State::prepare_acquire(std::uint64_t session, bool rdma_peer, bool windows,
                                                            const Acquire& request) {
  // A name that is not one is refused before anything looks it up, and the
  // lease caps are checked before the name is: a refused acquire costs no
  // file system call.
  if (auto valid = check_object_name(request.name); !valid) {
    ++stats.refused_requests;
    return error_reply(valid.error());
  }
  if (auto refused = lease_cap_refusal(session)) {
    ++stats.refused_requests;
    return error_reply(*refused);
  }
  PendingAcquire pending{Lease{session, request.name, {}, std::nullopt, 0, nullptr, {}},
                         publications.contains(request.name),
                         windows,
                         nullptr,
                         false,
                         request.wants_rdma,
                         rdma_peer};
  if (async_resolver && !pending.cacheable) {
    // Looked up off the loop: counted against the caps meanwhile.
    pending.unresolved = true;
    pending.under_way = std::make_unique<AcquireUnderWay>(*this, session);
    return pending;
  }
  auto object = find(request.name);
  return decide(std::move(pending), std::move(object));
}

Owner::State::PreparedAcquire Owner::State::decide(PendingAcquire pending, Result<PublishedObject> object) {
  if (!object) {
    if (object.error().is(errc::region_not_found)) {
      ++stats.not_found;
      return NotFound{};
    }
    return error_reply(object.error());
  }
  auto& lease = pending.lease;
  const std::uint64_t size = object.value().bytes.size();
  lease.object = std::move(object).value();
  if (const auto publication = publications.publication_of(lease.name); publication != 0 && pending.cacheable) {
    lease.publication = publication;
  }
  lease.generation =
      lease.publication ? *lease.publication : publications.resolved_generation(lease.name, lease.object);
  if (draining) return grant_lease(std::move(lease), ChunkedReason::draining);
  if (!pending.wants_rdma || !pending.rdma_peer) return grant_lease(std::move(lease), ChunkedReason::no_offer);
  if (size < config.rdma_threshold) return grant_lease(std::move(lease), ChunkedReason::below_threshold);
  if (auto ready = export_at_once(lease.name, lease.object, pending.cacheable)) {
    lease.exported = std::move(ready);
    return grant_lease(std::move(lease), std::nullopt);
  }
  if (!pending.under_way) pending.under_way = std::make_unique<AcquireUnderWay>(*this, lease.session);
  pending.unresolved = false;
  return pending;
}

asio::awaitable<Result<PublishedObject>> Owner::State::resolve(std::string name, asio::cancellation_slot abandoned) {
  auto self = shared_from_this();
  auto lookup = async_resolver;  // kept: a resolver set meanwhile does not pull it away
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(Result<PublishedObject>)>(
      [&lookup, &name, ex = executor, abandoned](auto handler) {
        // Answered from any thread: taken back to the owner's executor,
        // which is also the handler's own (so that a resolver answering on
        // "the handler's executor" does not queue the answer behind its own
        // work). The resolver sees `abandoned` as its handler's cancellation
        // slot (the coroutine's own is not connected: acquires run detached).
        auto back_home = [ex, done = std::move(handler)](Result<PublishedObject> found) mutable {
          asio::post(ex, [done = std::move(done), found = std::move(found)]() mutable {
            std::move(done)(std::move(found));
          });
        };
        lookup(std::move(name),
               ResolveHandler(asio::bind_executor(ex, asio::bind_cancellation_slot(abandoned, std::move(back_home)))));
      },
      asio::use_awaitable);
}

asio::awaitable<Grant> Owner::State::complete_acquire(PendingAcquire pending, asio::cancellation_slot abandoned) {
  if (pending.unresolved) {
    auto object = co_await resolve(pending.lease.name, abandoned);
    auto decided = decide(std::move(pending), std::move(object));
    if (auto* grant = std::get_if<Grant>(&decided)) co_return std::move(*grant);
    pending = std::get<PendingAcquire>(std::move(decided));
  }
  auto& lease = pending.lease;
  std::optional<ChunkedReason> reason;
  auto exported = co_await export_object(lease.name, lease.object, pending.cacheable);
  if (exported) {
    lease.exported = std::move(exported).value();
  } else if (pending.windows && exported.error().is(errc::budget_exceeded)) {
    auto window = co_await export_window(lease.object, 0, leases.windowed() + 1);
    if (window) {
      lease.exported = std::move(window).value();
      lease.windowed = true;
      lease.window_end = lease.exported->guard.size();
    } else {
      reason = window.error().is(errc::budget_exceeded) ? ChunkedReason::no_window : reason_for(window.error());
    }
  } else {
    reason = reason_for(exported.error());
  }
  co_return grant_lease(std::move(lease), reason);
}

Grant Owner::State::grant_lease(Lease lease, std::optional<ChunkedReason> reason) {
  const std::uint64_t size = lease.object.bytes.size();
  const auto timeout_ms = static_cast<std::uint32_t>(config.lease_timeout.count());
  const auto generation = lease.generation;
  if (reason) {
    ++stats.decisions.chunked_by_reason[std::string(to_string(*reason))];
    lease.exported = nullptr;
    const auto id = leases.add(std::move(lease));
    return Chunked{id, size, config.chunk_size, timeout_ms, *reason, generation};
  }
  ++stats.decisions.rdma;
  auto descriptor = lease.exported->descriptor;
  if (lease.windowed) {
    const auto window_len = lease.window_end;
    const auto id = leases.add(std::move(lease));
    return RdmaWindow{id, size, timeout_ms, 0, window_len, std::move(descriptor), generation};
  }
  const auto id = leases.add(std::move(lease));
  return RdmaGrant{id, size, timeout_ms, std::move(descriptor), generation};
}

Result<PublishedObject> Owner::State::pull(std::uint64_t session, const Pull& request) {
  Lease* lease = leases.held(session, request.lease);
  if (lease == nullptr) {
    ++stats.refused_requests;
    return Error{errc::region_not_found, "no such lease on this connection"};
  }
  if (request.len > config.chunk_size) {
    ++stats.refused_requests;
    return Error{errc::out_of_range, "pull larger than the chunk size"};
  }
  // Nothing outside the published range is ever sent.
  if (auto inside = validate_slice(request.offset, request.len, lease->object.bytes.size()); !inside) {
    ++stats.refused_requests;
    return std::move(inside).error();
  }
  leases.renew(*lease);
  ++stats.pulls;
  stats.pulled_bytes += request.len;
  return PublishedObject{lease->object.bytes.subspan(request.offset, request.len), lease->object.keepalive};
}

Message Owner::State::renew(std::uint64_t session, const Renew& request) {
  Lease* lease = leases.held(session, request.lease);
  if (lease == nullptr) {
    ++stats.refused_requests;
    return error_reply(Error{errc::region_not_found, "no such lease on this connection"});
  }
  leases.renew(*lease);
  return Renewed{static_cast<std::uint32_t>(config.lease_timeout.count())};
}

Message Owner::State::heartbeat(std::uint64_t session) {
  ++stats.heartbeats;
  const auto renewed = leases.renew_all(session);
  return rendezvous::HeartbeatOk{renewed, static_cast<std::uint32_t>(config.lease_timeout.count())};
}

Message Owner::State::release(std::uint64_t session, const Release& request) {
  Lease* lease = leases.held(session, request.lease);
  if (lease == nullptr) {
    // Lapsed (or never granted): what was read under it is not proven one
    // version, and the consumer must learn so rather than read success.
    ++stats.refused_requests;
    return error_reply(Error{errc::region_not_found, "no such lease on this connection (it lapsed, or was never granted)"});
  }
  const bool changed = republished_since(*lease);
  leases.erase(request.lease);
  ++stats.leases_released;
  if (changed) return error_reply(Error{errc::object_changed, "the object was published again during the lease"});
  return Released{};
}

std::uint16_t Owner::State::announced_batch() const {
  const std::size_t half_the_leases = std::max<std::size_t>(config.max_leases_per_connection / 2, 1);
  return static_cast<std::uint16_t>(
      std::clamp<std::size_t>(std::min(config.max_batch_objects, half_the_leases), 1, max_grants_per_frame));
}

std::optional<ErrorReply> Owner::State::admit_batch(std::size_t size) {
  if (size > announced_batch()) {
    ++stats.refused_requests;
    return error_reply(Error{errc::budget_exceeded, "a batch of " + std::to_string(size) +
                                                        " elements exceeds this owner's limit of " +
                                                        std::to_string(announced_batch())});
  }
  ++stats.batch_requests;
  return std::nullopt;
}

Message Owner::State::release_many(std::uint64_t session, const ReleaseMany& request) {
  if (auto refused = admit_batch(request.leases.size())) return std::move(*refused);
  ReleasedMany released;
  released.codes.reserve(request.leases.size());
  for (auto lease : request.leases) {
    if (leases.held(session, lease) == nullptr) {
      ++stats.refused_requests;
      released.codes.push_back(static_cast<std::uint16_t>(errc::region_not_found));
      continue;
    }
    auto answer = release(session, Release{lease});
    const auto* error = std::get_if<ErrorReply>(&answer);
    released.codes.push_back(error != nullptr ? error->code : 0);
  }
  return released;
}

asio::awaitable<void> Owner::State::reap() {
  auto self = shared_from_this();
  while (!draining) {
    reaper.expires_after(config.reap_interval);
    auto [ec] = co_await reaper.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec) break;
    stats.leases_expired += leases.expire(clock_type::now());
  }
}

}  // namespace corma
