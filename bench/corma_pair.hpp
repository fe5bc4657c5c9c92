// Two corma UCX backends connected as peers, the way the transfer
// benchmarks use them.
#pragma once

#include "bench_support.hpp"

#include <corma/ucx.hpp>

#include <boost/asio/use_future.hpp>

#include <memory>
#include <string>

namespace corma::bench {

/// A corma initiator and target connected as peers, with one exported
/// region on the target (its key imported once by the initiator) and one
/// local region on the initiator.
struct CormaPair {
  std::shared_ptr<ucx::Backend> initiator;
  std::shared_ptr<ucx::Backend> target;
  PeerId peer{};
  BackendRegion remote;
  BackendRegion local;
  RemoteKeyId key{};

  /// A get of `size` bytes at `offset` on both sides, naming the imported key.
  [[nodiscard]] GetRequest get(std::size_t offset, std::size_t size) const {
    return GetRequest{peer, local.id, offset, remote.effective_addr + offset, size, key};
  }

  CormaPair(const std::string& transport, std::byte* remote_memory, std::byte* local_memory, std::size_t size,
            Access remote_access = Access::remote_read_write) {
    using boost::asio::use_future;
    initiator = must(ucx::Backend::create(corma_config(transport)), "corma initiator");
    target = must(ucx::Backend::create(corma_config(transport)), "corma target");
    auto offer = must(initiator->async_peer_offer(use_future).get(), "offer");
    auto answer = must(target->async_peer_accept(offer.blob, use_future).get(), "accept");
    must(initiator->async_peer_complete(offer.peer, answer.blob, use_future).get(), "complete");
    peer = offer.peer;
    remote = must(target->async_map(remote_memory, size, remote_access, use_future).get(), "map");
    local = must(initiator->async_map(local_memory, size, Access::local, use_future).get(), "map");
    key = must(initiator->async_import_key(peer, remote.packed_key, use_future).get(), "import key");
  }
};

}  // namespace corma::bench
