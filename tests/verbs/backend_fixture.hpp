// What the verbs backend's own tests share: backends over the software
// provider (tests/support/soft_verbs.*), connected pairs, and links that
// export a pattern on one side and register a sink on the other.
#pragma once

#include "support/soft_verbs.hpp"

#include "provider_table.hpp"

#include <corma/verbs.hpp>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <stdexcept>
#include <vector>

namespace corma::verbs {

namespace asio = boost::asio;

/// The answer behind a future, or a test failure (thrown) if none comes.
template <class T>
T answered(std::future<T> future, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  if (future.wait_for(limit) != std::future_status::ready) throw std::runtime_error("no answer in time");
  return future.get();
}

inline std::uint64_t address(const std::vector<std::byte>& bytes) {
  return reinterpret_cast<std::uint64_t>(bytes.data());
}

inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return bytes;
}

class VerbsBackend : public ::testing::Test {
 protected:
  void SetUp() override { fabric.reset(); }
  void TearDown() override { EXPECT_EQ(fabric.overruns(), 0u) << "the backend overran a send queue"; }

  std::shared_ptr<Backend> make(Config config = {}) {
    auto backend = corma::verbs::create_over(config, fabric.api());
    if (!backend) throw std::runtime_error(backend.error().message());
    return std::move(backend).value();
  }

  /// Connects `a` (initiator) to `b`; returns a's peer id for b.
  static PeerId connect(Backend& a, Backend& b) {
    auto offer = answered(a.async_peer_offer(asio::use_future)).value();
    auto reply = answered(b.async_peer_accept(offer.blob, asio::use_future)).value();
    answered(a.async_peer_complete(offer.peer, reply.blob, asio::use_future)).value();
    return offer.peer;
  }

  static BackendRegion map(Backend& backend, std::vector<std::byte>& memory, Access access) {
    return answered(backend.async_map(memory.data(), memory.size(), access, asio::use_future)).value();
  }

  /// Reads `len` bytes from the start of `remote_bytes` (exported as `remote`).
  static Result<void> get(Backend& backend, PeerId peer, const BackendRegion& local, const BackendRegion& remote,
                          const std::vector<std::byte>& remote_bytes, std::uint64_t len) {
    GetRequest request{peer, local.id, 0, address(remote_bytes), len, remote.packed_key};
    return answered(backend.async_get(std::move(request), asio::use_future));
  }

  /// Two backends, `a` connected to `b`; `b` exports `source` (a pattern)
  /// with `remote_access`, `a` registers `sink` (zeros) locally.
  struct Link {
    std::shared_ptr<Backend> a, b;
    PeerId peer{};
    std::vector<std::byte> source, sink;
    BackendRegion remote, local;

    /// Reads the first `len` bytes of `source` into `sink`.
    [[nodiscard]] Result<void> get(std::uint64_t len) const { return VerbsBackend::get(*a, peer, local, remote, source, len); }
    /// The i-th `len`-byte slice, from source into sink, not yet awaited.
    [[nodiscard]] std::future<Result<void>> start_get(std::uint64_t i, std::uint64_t len) const {
      return a->async_get(slice(i, len), asio::use_future);
    }
    /// The request for the i-th `len`-byte slice.
    [[nodiscard]] TransferRequest slice(std::uint64_t i, std::uint64_t len) const {
      return TransferRequest{peer, local.id, i * len, address(source) + i * len, len, remote.packed_key};
    }
  };

  Link link(std::size_t bytes, unsigned seed, Access remote_access = Access::remote_read, Config a_config = {}) {
    Link l;
    l.a = make(a_config);
    l.b = make();
    l.peer = connect(*l.a, *l.b);
    l.source = pattern(bytes, seed);
    l.sink.assign(bytes, std::byte{0});
    l.remote = map(*l.b, l.source, remote_access);
    l.local = map(*l.a, l.sink, Access::local);
    return l;
  }

  /// A link whose initiator has a send queue only `depth` deep.
  Link shallow_link(std::uint32_t depth, std::size_t bytes, unsigned seed) {
    Config shallow;
    shallow.send_queue_depth = depth;
    return link(bytes, seed, Access::remote_read, shallow);
  }
  corma::testing::SoftVerbs& fabric = corma::testing::SoftVerbs::instance();
};

}  // namespace corma::verbs
