// One connection: its hello, then its requests, worked on concurrently
// (registrations in the background, everything else answered at once).
#include "rendezvous/owner/owner_state.hpp"
#include "rendezvous/owner/hello.hpp"
#include "rendezvous/protocol/owner_proof.hpp"

#include <boost/asio/post.hpp>
#include <algorithm>
#include <chrono>
#include <boost/asio/use_awaitable.hpp>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

asio::awaitable<Owner::State::Greeting> Owner::State::handshake(FramedConnection& connection) {
  Greeting greeting;
  // One deadline for the whole handshake, a proof included: a client that
  // asks for the proof holds its place among max_handshakes no longer
  // than one that only says hello.
  const auto deadline = std::chrono::steady_clock::now() + config.io_timeout;
  const auto left = [deadline] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  auto first = co_await connection.read(left(), left());
  if (first && std::holds_alternative<Prove>(first.value().message)) {
    // A consumer holding the cluster key asks for the proof before its
    // hello, bound to the address it reached this owner at; an owner that
    // cannot give it says so and closes.
    boost::system::error_code ec;
    const auto reached = connection.socket().local_endpoint(ec);
    if (ec) co_return greeting;
    auto proof = answer_prove(std::get<Prove>(first.value().message), config.cluster_key, config.owner_id,
                              proof_endpoint(reached));
    const bool proved = std::holds_alternative<Proof>(proof);
    Frame answer{first.value().request_id, std::move(proof)};
    if (!proved) ++stats.refused_requests;
    if (!(co_await connection.write(answer, left())) || !proved) co_return greeting;
    first = co_await connection.read(left(), left());
  }
  if (!first || !std::holds_alternative<Hello>(first.value().message)) {
    ++stats.refused_requests;
    co_return greeting;
  }
  auto answered = co_await answer_hello(registry ? registry->backend().get() : nullptr,
                                        std::move(std::get<Hello>(first.value().message)), announced_batch());
  // A refused hello (an unsupported version) is a refused request.
  auto* ok = std::get_if<HelloOk>(&answered.reply);
  if (ok == nullptr) ++stats.refused_requests;
  greeting.version = ok != nullptr ? ok->version : 0;
  greeting.peer = answered.peer;
  Frame reply{first.value().request_id, std::move(answered.reply)};
  const bool written = static_cast<bool>(co_await connection.write(reply, left()));
  greeting.ok = written && ok != nullptr;
  co_return greeting;
}

asio::awaitable<bool> Owner::State::take(const Session& session, AnswerQueue& answers, Frame frame) {
  const auto request_id = frame.request_id;
  auto& message = frame.message;
  Message reply = ErrorReply{static_cast<std::uint16_t>(errc::protocol), "unexpected message"};
  bool hostile = false;
  if (std::holds_alternative<Acquire>(message) ||
      (session.version2 && std::holds_alternative<NextWindow>(message))) {
    queue_request(session, answers, std::move(frame));
    co_return true;
  }
  const bool push_request = std::holds_alternative<PushOpen>(message) || std::holds_alternative<PushConnect>(message) ||
                            std::holds_alternative<Push>(message);
  if (push_request && session.version3) {
    start_push_request(session, answers, std::move(frame));
    co_return true;
  }
  if (auto* many = std::get_if<AcquireMany>(&message); many != nullptr && session.version2) {
    // A batch over the announced limit is refused whole, at once.
    auto refused = admit_batch(many->names.size());
    if (!refused) {
      queue_request(session, answers, std::move(frame));
      co_return true;
    }
    reply = std::move(*refused);
  } else if (auto* pull_request = std::get_if<Pull>(&message)) {
    auto slice = pull(session.id, *pull_request);
    if (slice) {
      co_await answers.answer_data(request_id, pull_request->offset, slice.value().bytes,
                                   std::move(slice.value().keepalive));
      co_return true;
    }
    reply = error_reply(std::move(slice).error());
  } else if (auto* renew_request = std::get_if<Renew>(&message)) {
    reply = renew(session.id, *renew_request);
  } else if (std::holds_alternative<rendezvous::Heartbeat>(message) && session.version4) {
    reply = heartbeat(session.id);
  } else if (auto* release_request = std::get_if<Release>(&message)) {
    reply = release(session.id, *release_request);
  } else if (auto* to_release = std::get_if<ReleaseMany>(&message); to_release != nullptr && session.version2) {
    reply = release_many(session.id, *to_release);
  } else if (std::holds_alternative<AcquireMany>(message) || std::holds_alternative<ReleaseMany>(message) ||
             std::holds_alternative<NextWindow>(message)) {
    ++stats.refused_requests;  // a version 1 session: answered, the connection kept
    reply = ErrorReply{static_cast<std::uint16_t>(errc::protocol), "this request needs protocol version 2"};
  } else if (push_request) {
    ++stats.refused_requests;  // answered, the connection kept
    reply = ErrorReply{static_cast<std::uint16_t>(errc::protocol), "push needs protocol version 3"};
  } else if (std::holds_alternative<rendezvous::Heartbeat>(message)) {
    ++stats.refused_requests;  // answered, the connection kept
    reply = ErrorReply{static_cast<std::uint16_t>(errc::protocol), "heartbeat needs protocol version 4"};
  } else {
    hostile = true;  // a consumer never sends owner messages
    ++stats.refused_requests;
  }
  Frame response{request_id, std::move(reply)};
  co_await answers.answer(std::move(response));
  co_return !hostile;
}

asio::awaitable<void> Owner::State::session(asio::ip::tcp::socket socket) {
  auto self = shared_from_this();
  auto connection = std::make_shared<FramedConnection>(std::move(socket), default_max_frame_body);
  std::optional<rendezvous::ConnectionTable::Session> listed;
  listed.emplace(connections, connection);
  ++stats.connections;
  const std::uint64_t session_id = listed->id();
  const auto greeting = co_await handshake(*connection);
  listed->handshake_ended();
  const auto& peer = greeting.peer;
  const Session session{session_id, peer.has_value(), greeting.version >= batch_protocol_version,
                        greeting.version >= push_protocol_version, greeting.version >= heartbeat_protocol_version};
  AnswerQueue answers(*connection, config.io_timeout, greeting.version);
  const auto in_flight = std::max<std::size_t>(config.max_requests_in_flight, 1);
  const auto names_in_flight = std::max<std::size_t>(config.max_names_in_flight, 1);
  for (std::uint64_t served = 1; greeting.ok && connection->is_open() && !answers.failed(); ++served) {
    // Frames already buffered are read without suspending: each connection
    // reads one frame per turn of the event loop, so that a turn stays
    // short however many connections stream requests, and a newcomer's
    // hello waits for at most one frame of each.
    if (served > 1) co_await asio::post(executor, asio::use_awaitable);
    co_await answers.until_below(in_flight, names_in_flight);
    co_await work.until_taken(session_id);
    if (!connection->is_open()) break;
    auto frame = co_await connection->read(config.idle_timeout, config.io_timeout);
    if (!frame) {
      if (frame.error().is(errc::protocol)) ++stats.refused_requests;
      break;
    }
    answers.begin();
    if (!co_await take(session, answers, std::move(frame).value())) break;
  }
  // Every request taken is answered (or its answer dropped with the
  // connection) before the session's leases and peer go; acquires still
  // waiting for their turn are given up, and so are the look-ups of
  // acquires and pushes under way.
  work.drop(session_id);
  push_peers.give_up_lookups(session_id);
  co_await answers.until_below(1);
  connection->close();
  listed.reset();
  leases.drop_session(session_id);
  co_await close_push_peer(session_id);
  if (peer && registry) {
    (void)co_await registry->backend()->async_peer_close(*peer, asio::use_awaitable);
  }
}

void Owner::State::refuse(asio::ip::tcp::socket& socket) {
  ++stats.refused_connections;
  const auto bytes = encode_frame(Frame{0, error_reply(Error{errc::budget_exceeded, "too many connections"})});
  boost::system::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(bytes), ignored);
  socket.close(ignored);
}

}  // namespace corma
