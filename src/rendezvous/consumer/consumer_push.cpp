// Push fetches (protocol version 3): the owner writes the object into a
// landing this consumer offers for it. The owner's backend needs a peer it
// initiates towards this side (the hello's peer goes the other way): the
// first push sets it up with push_open / push_connect, and every push
// after uses it. A push the owner does not take is read the ordinary way,
// exactly once.
#include "rendezvous/consumer/consumer_state.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

namespace {

/// Errors after which the object cannot be had by reading it either.
bool final_refusal(const Error& error) {
  return error.is(errc::out_of_range) || error.is(errc::object_changed) || error.is(errc::peer_unreachable) ||
         error.is(errc::timeout) || error.is(errc::protocol);
}

}  // namespace

asio::awaitable<Result<PeerId>> Consumer::State::push_peer_ready() {
  while (push_setup) {
    // Another push sets the peer up now: its outcome is this one's.
    const auto setting_up = push_setup;
    (void)co_await setting_up->async_wait(asio::as_tuple(asio::use_awaitable));
  }
  if (push_peer) co_return *push_peer;
  if (push_unavailable) co_return *push_unavailable;
  if (!registry) co_return fail(errc::not_configured, "a consumer without a registry takes no pushes");
  if (version < push_protocol_version) {
    co_return *(push_unavailable = Error{errc::not_configured, "the owner speaks protocol version " +
                                                                   std::to_string(version) + ", push needs 3"});
  }
  push_setup = std::make_shared<asio::steady_timer>(executor, asio::steady_timer::time_point::max());
  struct Done {  // wakes the waiters however the set-up ends
    std::shared_ptr<asio::steady_timer>& setup;
    ~Done() { std::exchange(setup, nullptr)->cancel(); }
  } done{push_setup};

  // Named, not temporaries: g++ 12 destroys a temporary argument of a
  // co_await expression twice.
  Message open_request = PushOpen{};
  CORMA_CO_TRY(auto opened, co_await request(std::move(open_request)));
  auto* offer = std::get_if<PushOffer>(&opened);
  if (offer == nullptr) co_return fail(errc::protocol, "owner answered push_open with something else");
  auto backend = registry->backend();
  auto accepted = co_await backend->async_peer_accept(std::move(offer->peer_offer), asio::use_awaitable);
  if (!accepted) co_return std::move(accepted).error();
  const auto new_peer = accepted.value().peer;
  Message connect_request = PushConnect{std::move(accepted.value().blob)};
  auto connected = co_await request(std::move(connect_request));
  if (!connected || !std::holds_alternative<PushReady>(connected.value())) {
    (void)co_await backend->async_peer_close(new_peer, asio::use_awaitable);
    if (!connected) co_return std::move(connected).error();
    co_return fail(errc::protocol, "owner answered push_connect with something else");
  }
  push_peer = new_peer;
  co_return new_peer;
}

asio::awaitable<Result<FetchOutcome>> Consumer::State::push_fetch(std::string name, RegionGuard& landing,
                                                                   PushOptions options) {
  CORMA_CO_TRY(check_object_name(name));
  if (!landing) co_return fail(errc::region_not_found, "the landing is not registered");
  if (options.offset > landing.size()) {
    co_return fail(errc::out_of_range, "offset " + std::to_string(options.offset) + " is past the landing's " +
                                           std::to_string(landing.size()) + " bytes");
  }
  const auto capacity = landing.size() - options.offset;
  if (co_await cancelled_here()) co_return fetch_cancelled("before it was asked");

  auto peer_ready = co_await push_peer_ready();
  // Cancelled while the push peer was set up: nothing of this fetch was sent.
  if (co_await cancelled_here()) co_return fetch_cancelled("before its push was asked");
  std::optional<Error> refused;
  if (!peer_ready) {
    // Losing the owner while setting up is the fetch's end; anything else
    // only means this owner does not push to us.
    if (!push_unavailable && !peer_ready.error().is(errc::protocol) && !lost()) push_unavailable = peer_ready.error();
    if (lost()) co_return *lost();
    refused = std::move(peer_ready).error();
  } else if (capacity > 0) {
    // The landing's bytes from the offset on, with its key: all the owner learns.
    auto offered = landing.remote();
    offered.addr += options.offset;
    offered.len = capacity;
    CORMA_CO_TRY(auto descriptor, describe(offered));
    Message push = Push{name, options.notify_tag.has_value(), options.notify_tag.value_or(0), std::move(descriptor)};
    // Answered deaf to cancellation: the owner may be writing into the
    // landing until its answer comes (or the connection is lost).
    auto reply = co_await request(std::move(push));
    // Cancelled meanwhile: the owner has stopped writing now (its answer
    // came, or the connection is lost), and the fetch answers its
    // cancellation whatever the push did (the landing's bytes unspecified,
    // as after any terminal cancellation).
    if (co_await cancelled_here()) co_return fetch_cancelled("while the owner pushed it");
    if (reply) {
      if (std::holds_alternative<NotFound>(reply.value())) {
        co_return fail(errc::region_not_found, "owner has no object named '" + name + "'");
      }
      auto* pushed = std::get_if<Pushed>(&reply.value());
      if (pushed == nullptr) co_return fail(errc::protocol, "owner answered push with something else");
      if (pushed->size > capacity) {
        link->give_up(Error{errc::protocol, "owner pushed more bytes than the landing holds"});
        co_return fail(errc::protocol, "owner pushed more bytes than the landing holds");
      }
      ++stats.pushes;
      if (config.on_progress) config.on_progress(pushed->size, pushed->size);
      FetchOutcome outcome;
      outcome.size = pushed->size;
      outcome.length = pushed->size;
      outcome.generation = pushed->generation;
      outcome.path = Path::rdma;
      outcome.pushed = true;
      co_return outcome;
    }
    if (final_refusal(reply.error())) co_return std::move(reply).error();
    refused = std::move(reply).error();
  } else {
    refused = Error{errc::out_of_range, "the landing has no room past its offset"};
  }
  if (co_await cancelled_here()) co_return fetch_cancelled("after its push was refused");
  // Read instead, exactly once, into the same bytes.
  CORMA_CO_TRY(auto outcome, co_await fetch(std::move(name), registered_destination(landing, options.offset, capacity)));
  outcome.push_refusal = refused->message();
  co_return outcome;
}

}  // namespace corma
