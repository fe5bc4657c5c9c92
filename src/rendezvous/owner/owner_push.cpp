// Push (protocol version 3): a consumer offers memory of its own for one
// object and the owner writes the object there. The owner needs a peer it
// initiates for that (the hello's peer is the consumer's), set up by
// push_open / push_connect once per connection; each push then writes only
// into the landing the consumer named for that object, never past the
// object's size, and is answered once the bytes are in place there.
#include "rendezvous/owner/owner_state.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

namespace {

ErrorReply refusal(errc code, std::string detail) {
  return ErrorReply{static_cast<std::uint16_t>(code), std::move(detail)};
}

/// Works on one push request and answers it; the session waits for this
/// answer before it ends (AnswerQueue::until_below), so `answers` outlives it.
asio::awaitable<void> answer_push(std::shared_ptr<Owner::State> state, std::uint64_t session, AnswerQueue& answers,
                                  Frame request) {
  Message reply;
  try {
    if (std::holds_alternative<PushOpen>(request.message)) {
      reply = co_await state->push_open(session);
    } else if (auto* connect = std::get_if<PushConnect>(&request.message)) {
      reply = co_await state->push_connect(session, std::move(*connect));
    } else {
      reply = co_await state->push(session, std::get<Push>(std::move(request.message)));
    }
  } catch (const std::exception& e) {
    reply = error_reply(Error{errc::backend, std::string("the owner failed to answer: ") + e.what()});
  }
  Frame response{request.request_id, std::move(reply)};
  co_await answers.answer(std::move(response));
}

}  // namespace

void Owner::State::start_push_request(const Session& session, AnswerQueue& answers, Frame frame) {
  asio::co_spawn(executor, answer_push(shared_from_this(), session.id, answers, std::move(frame)), asio::detached);
}

asio::awaitable<Message> Owner::State::push_open(std::uint64_t session) {
  if (!config.accept_push || !registry) co_return refusal(errc::not_configured, "this owner takes no pushes");
  if (draining) co_return refusal(errc::shutting_down, "the owner is draining");
  if (!push_peers.begin_opening(session)) {
    ++stats.refused_requests;
    co_return refusal(errc::protocol, "this connection already opened its push peer");
  }
  auto offer = co_await registry->backend()->async_peer_offer(asio::use_awaitable);
  if (!offer) {
    push_peers.forget(session);
    co_return error_reply(offer.error());
  }
  push_peers.offered(session, offer.value().peer);
  co_return rendezvous::PushOffer{std::move(offer.value().blob)};
}

asio::awaitable<Message> Owner::State::push_connect(std::uint64_t session, PushConnect request) {
  const auto offered = push_peers.begin_connecting(session);
  if (!offered) {
    ++stats.refused_requests;
    co_return refusal(errc::protocol, "push_connect without a push_offer waiting for it");
  }
  const auto peer = *offered;
  // The backend checks every byte of the answer before its provider sees it
  // (what it cannot check is the trust OwnerConfig::accept_push states).
  auto connected =
      co_await registry->backend()->async_peer_complete(peer, std::move(request.peer_answer), asio::use_awaitable);
  if (!connected) {
    ++stats.refused_requests;
    push_peers.forget(session);
    (void)co_await registry->backend()->async_peer_close(peer, asio::use_awaitable);
    co_return error_reply(connected.error());
  }
  push_peers.connected(session);
  co_return rendezvous::PushReady{};
}

asio::awaitable<Message> Owner::State::push(std::uint64_t session, Push request) {
  // The request's own bytes first: a malformed landing is refused the same
  // way whatever state the connection is in.
  auto landing = decode_descriptor(request.landing);
  if (!landing) {
    ++stats.refused_requests;
    co_return error_reply(landing.error());
  }
  const auto ready = push_peers.ready(session);
  if (!ready) {
    ++stats.refused_requests;
    co_return refusal(errc::not_configured, "no push peer on this connection: push_open and push_connect first");
  }
  if (landing.value().backend != registry->backend()->wire_id()) {
    ++stats.refused_requests;
    co_return refusal(errc::invalid_key, "the landing names another backend");
  }
  const auto peer = *ready;
  if (auto valid = check_object_name(request.name); !valid) {
    ++stats.refused_requests;
    co_return error_reply(valid.error());
  }
  // A push holds its object as a lease does while it runs, and counts as one.
  if (auto refused = lease_cap_refusal(session)) {
    ++stats.refused_requests;
    co_return error_reply(*refused);
  }
  const AcquireUnderWay under_way(*this, session);
  if (draining) co_return refusal(errc::shutting_down, "the owner is draining");
  // Looked up as an acquire is: the resolver brought up to date first, and
  // an asynchronous one asked off the loop.
  if (refresh_resolver) refresh_resolver();
  Result<PublishedObject> object = find(request.name);
  if (!publications.contains(request.name) && async_resolver) {
    // Given up with its connection, as an acquire's look-up is. (The peer
    // outlives every push on it: closed only once they are answered.)
    PushPeerTable::LookUp lookup(push_peers, session);
    object = co_await resolve(request.name, lookup.slot());
  }
  if (!object) {
    if (!object.error().is(errc::region_not_found)) co_return error_reply(object.error());
    ++stats.not_found;
    co_return rendezvous::NotFound{};
  }
  const std::uint64_t size = object.value().bytes.size();
  // Never a byte past what the consumer offered for this object.
  if (landing.value().len < size) {
    ++stats.refused_requests;
    co_return refusal(errc::out_of_range, "the landing holds " + std::to_string(landing.value().len) +
                                              " bytes, the object " + std::to_string(size));
  }
  const bool published_here = publications.contains(request.name);
  const auto publication = publications.publication_of(request.name);
  const auto generation =
      published_here ? publication : publications.resolved_generation(request.name, object.value());
  auto backend = registry->backend();
  std::shared_ptr<Export> source;
  if (size > 0) {
    // The object's export serves as the put's source: kept registered
    // between pushes like a lease's, and charged to the budget the same way.
    auto exported = co_await export_object(request.name, object.value(), published_here);
    if (!exported) co_return error_reply(exported.error());
    source = std::move(exported).value();
  }
  // The put, then a notification (it arrives after the put's bytes are
  // visible) or a flush (it completes once they are), issued together: both
  // are submitted, in that order, before either is waited for.
  auto put = [&](auto token) {
    return source->guard.async_put(peer, landing.value(), TransferRange{0, 0, size}, std::move(token));
  };
  auto landed = [&](auto token) {
    return asio::async_initiate<decltype(token), void(Result<void>)>(
        [&](auto handler) {
          if (request.notify) return backend->async_notify(peer, request.tag, std::move(handler));
          backend->async_flush(peer, std::move(handler));
        },
        token);
  };
  Result<void> written = success();
  Result<void> done = success();
  if (source) {
    auto [order, put_result, landed_result] =
        co_await asio::experimental::make_parallel_group(put(asio::deferred), landed(asio::deferred))
            .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
    written = std::move(put_result);
    done = std::move(landed_result);
  } else {
    done = co_await landed(asio::use_awaitable);
  }
  if (!written) co_return error_reply(written.error());
  if (!done) co_return error_reply(done.error());
  if (published_here && publications.publication_of(request.name) != publication) {
    co_return refusal(errc::object_changed, "the object was published again while it was pushed");
  }
  ++stats.pushes;
  stats.pushed_bytes += size;
  co_return rendezvous::Pushed{size, generation};
}

asio::awaitable<void> Owner::State::close_push_peer(std::uint64_t session) {
  if (const auto peer = push_peers.take(session)) {
    (void)co_await registry->backend()->async_peer_close(*peer, asio::use_awaitable);
  }
}

}  // namespace corma
