// The owner's answer to a consumer's first frame, `hello`: the protocol
// version, and the consumer's peer offer handed to the owner's backend —
// whose own decoder is the only thing that looks at its bytes — when it
// names that backend. The owner's sessions and the handshake fuzzer both
// come through here.
#pragma once

#include "rendezvous/protocol/messages.hpp"

#include <corma/backend.hpp>

#include <boost/asio/awaitable.hpp>

#include <optional>
#include <string_view>

namespace corma::rendezvous {

struct HelloAnswer {
  Message reply;               ///< hello_ok, or an error for an unsupported version
  std::optional<PeerId> peer;  ///< the backend's peer for this consumer, when its offer was taken
};

/// The version both sides speak: the consumer's, or this owner's when the
/// consumer's is newer; nothing when it is older than any this owner serves.
[[nodiscard]] std::optional<std::uint16_t> negotiated_version(std::uint16_t offered) noexcept;

/// `backend` may be null (an owner without RDMA). An offer for another
/// backend, or one the backend refuses, is answered as no offer: hello_ok
/// naming no backend, and the consumer reads in chunks. `max_batch` is the
/// owner's batch limit, announced to version 2 consumers.
/// The answer to a consumer's challenge (`prove`, before its hello) that
/// reached this owner at `endpoint` (proof_endpoint of the socket's local
/// end): a proof with `owner_id`, when this owner has a cluster `key` of at
/// least min_cluster_key_size bytes and an id of 1..max_proof_owner_id
/// bytes; otherwise `error` `not_owned` (and the connection is closed).
[[nodiscard]] Message answer_prove(const Prove& prove, std::string_view key, std::string_view owner_id,
                                   std::string_view endpoint);

[[nodiscard]] boost::asio::awaitable<HelloAnswer> answer_hello(RdmaBackend* backend, Hello hello,
                                                               std::uint16_t max_batch);

}  // namespace corma::rendezvous
