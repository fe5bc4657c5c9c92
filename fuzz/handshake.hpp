// The property the handshake fuzzer (and the corpus replay test) checks: the
// first frame body an owner reads goes through the owner's own hello path
// (decode_frame_body, then answer_hello) to a real UCX backend, in-process.
// Nothing may crash; a peer is made exactly for the backend's own offer, its
// answer is sent in hello_ok, and it is closed again; anything else is
// answered as no offer.
#pragma once

#include "roundtrip.hpp"

#include "rendezvous/owner/hello.hpp"

#include <corma/ucx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <memory>
#include <span>
#include <vector>

namespace corma::fuzz {

/// A UCX backend an owner could run, and the one offer it takes: the one a
/// reader of its kind makes.
struct HandshakeSubject {
  std::shared_ptr<ucx::Backend> backend;
  std::vector<std::byte> valid_offer;
};

/// The configurations whose owners take offers: shared memory (error
/// handling none) and trusted tcp on loopback. Throws if UCX cannot start.
inline std::vector<HandshakeSubject> handshake_subjects() {
  const ucx::Config configs[] = {
      {.transport = ucx::Transport::shared_memory, .error_handling = ucx::ErrorHandling::none},
      {.transport = ucx::Transport::tcp, .trusted_peers = true, .tcp_interface = "lo"}};
  std::vector<HandshakeSubject> subjects;
  for (const auto& config : configs) {
    auto backend = ucx::Backend::create(config).value();
    auto offer = backend->async_peer_offer(boost::asio::use_future).get().value();
    backend->async_peer_close(offer.peer, boost::asio::use_future).get().value();
    subjects.push_back({std::move(backend), std::move(offer.blob)});
  }
  return subjects;
}

/// The batch limit the fuzzed owner announces.
inline constexpr std::uint16_t handshake_max_batch = 64;

/// `accepted`: a peer was made (and closed again).
inline Check check_handshake(std::span<const std::byte> body, const HandshakeSubject& subject) {
  namespace rv = rendezvous;
  Check c;
  auto frame = rv::decode_frame_body(body);
  auto* hello = frame ? std::get_if<rv::Hello>(&frame.value().message) : nullptr;
  if (hello == nullptr) return c;
  const auto version = rv::negotiated_version(hello->version);
  const bool takeable = version && hello->backend == ucx::backend_id && hello->peer_offer == subject.valid_offer;
  const bool other_version = !version;
  boost::asio::io_context io;
  auto answering = boost::asio::co_spawn(io, rv::answer_hello(subject.backend.get(), std::move(*hello), handshake_max_batch),
                                         boost::asio::use_future);
  io.run();  // until the backend has answered
  const auto answer = answering.get();
  auto* ok = std::get_if<rv::HelloOk>(&answer.reply);
  if (ok != nullptr && (!version || ok->version != *version ||
                        (ok->max_batch != 0) != (*version >= rv::batch_protocol_version))) {
    c.mismatch = "hello_ok names another version than the one negotiated";
  }
  if (answer.peer) {
    c.accepted = true;
    if (!subject.backend->async_peer_close(*answer.peer, boost::asio::use_future).get()) {
      c.mismatch = "the accepted peer could not be closed";
    } else if (!takeable) {
      c.mismatch = "a peer was made for an offer that is not the backend's own";
    } else if (ok == nullptr || ok->backend != ucx::backend_id || ok->peer_answer.empty()) {
      c.mismatch = "a peer was made but hello_ok does not carry its answer";
    }
  } else if (takeable) {
    c.mismatch = "the backend's own offer was refused";
  } else if (other_version) {
    if (!std::holds_alternative<rv::ErrorReply>(answer.reply)) c.mismatch = "another protocol version was answered";
  } else if (ok == nullptr || ok->backend != BackendId::none || !ok->peer_answer.empty()) {
    c.mismatch = "an offer that was not taken is answered as taken";
  }
  return c;
}

}  // namespace corma::fuzz
