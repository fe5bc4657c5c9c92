// The owner's answer to a consumer's first frame, `hello`: the protocol
// version, and the consumer's peer offer handed to the owner's backend —
// whose own decoder is the only thing that looks at its bytes — when it
// names that backend. The owner's sessions and the handshake fuzzer both
// come through here.
#pragma once

#include "messages.hpp"

#include <corma/backend.hpp>

#include <boost/asio/awaitable.hpp>

#include <optional>

namespace corma::rendezvous {

struct HelloAnswer {
  Message reply;               ///< hello_ok, or an error for an unsupported version
  std::optional<PeerId> peer;  ///< the backend's peer for this consumer, when its offer was taken
};

/// `backend` may be null (an owner without RDMA). An offer for another
/// backend, or one the backend refuses, is answered as no offer: hello_ok
/// naming no backend, and the consumer reads in chunks.
[[nodiscard]] boost::asio::awaitable<HelloAnswer> answer_hello(RdmaBackend* backend, Hello hello);

}  // namespace corma::rendezvous
