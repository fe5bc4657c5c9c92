// Two connected backends of a kind named on a command line, for the child
// programs: the initiator gets from the target. UCX comes from its public
// header; the in-process test backend and verbs over the software provider
// from tests/support (there is no device here).
#pragma once

#include "programs/child.hpp"

#include <corma/backend.hpp>

#include <boost/asio/use_future.hpp>

#include <memory>
#include <string>

namespace corma::programs {

struct BackendPair {
  std::shared_ptr<RdmaBackend> initiator;
  std::shared_ptr<RdmaBackend> target;
  PeerId peer{};  ///< the initiator's name for the target
};

/// Makes and connects two backends of kind `name` (test, ucx-tcp, ucx-shm,
/// verbs-soft); an empty pair with `unavailable` set when this build or
/// host has no such backend.
BackendPair make_pair(const std::string& name, std::string& unavailable);

/// Offer, accept, complete: `pair.peer` then names the target.
inline void connect(BackendPair& pair) {
  namespace asio = boost::asio;
  auto offer = pair.initiator->async_peer_offer(asio::use_future).get();
  if (!offer) fail_run("peer offer: " + offer.error().message());
  auto answer = pair.target->async_peer_accept(offer.value().blob, asio::use_future).get();
  if (!answer) fail_run("peer accept: " + answer.error().message());
  auto completed = pair.initiator->async_peer_complete(offer.value().peer, answer.value().blob, asio::use_future).get();
  if (!completed) fail_run("peer complete: " + completed.error().message());
  pair.peer = offer.value().peer;
}

}  // namespace corma::programs
