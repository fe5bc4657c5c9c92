#include "rendezvous/owner/hello.hpp"

#include "rendezvous/protocol/owner_proof.hpp"

#include <corma/rendezvous.hpp>

#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace corma::rendezvous {

std::optional<std::uint16_t> negotiated_version(std::uint16_t offered) noexcept {
  if (offered < oldest_protocol_version) return std::nullopt;
  return std::min(offered, protocol_version);
}

Message answer_prove(const Prove& prove, std::string_view key, std::string_view owner_id,
                     std::string_view endpoint) {
  if (key.size() < min_cluster_key_size || owner_id.empty() || owner_id.size() > max_proof_owner_id) {
    return ErrorReply{static_cast<std::uint16_t>(errc::not_owned), "this owner holds no cluster key"};
  }
  const auto key_bytes = std::as_bytes(std::span{key.data(), key.size()});
  auto mac = owner_proof_mac(key_bytes, prove.challenge, owner_id, endpoint);
  if (!mac) return ErrorReply{static_cast<std::uint16_t>(errc::not_owned), "this owner cannot compute its proof"};
  return Proof{std::string(owner_id), mac.value()};
}

boost::asio::awaitable<HelloAnswer> answer_hello(RdmaBackend* backend, Hello hello, std::uint16_t max_batch) {
  const auto version = negotiated_version(hello.version);
  if (!version) {
    co_return HelloAnswer{ErrorReply{static_cast<std::uint16_t>(errc::protocol), "unsupported protocol version"}, {}};
  }
  HelloOk answer;
  answer.version = *version;
  answer.max_batch = *version >= batch_protocol_version
                         ? static_cast<std::uint16_t>(std::clamp<std::size_t>(max_batch, 1, max_batch_objects))
                         : 0;
  std::optional<PeerId> peer;
  if (backend != nullptr && hello.backend != BackendId::none && hello.backend == backend->wire_id() &&
      !hello.peer_offer.empty()) {
    auto accepted = co_await backend->async_peer_accept(std::move(hello.peer_offer), boost::asio::use_awaitable);
    if (accepted) {
      answer.backend = hello.backend;
      answer.peer_answer = std::move(accepted.value().blob);
      peer = accepted.value().peer;
    }
  }
  co_return HelloAnswer{std::move(answer), peer};
}

}  // namespace corma::rendezvous
