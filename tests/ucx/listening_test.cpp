// The listening surface of a UCX backend: which TCP sockets this process
// listens on once the backend exists. Untrusted tcp and shared memory open
// none; trusted tcp listens only on the interface it was given.
#include "support/listening_sockets.hpp"

#include <corma/ucx.hpp>

#include <gtest/gtest.h>

#include <algorithm>

namespace {

namespace ucx = corma::ucx;
using boost::asio::ip::tcp;

/// The sockets this process started listening on while `config`'s backend
/// was created (and still listens on while it lives).
std::vector<tcp::endpoint> opened_by(const ucx::Config& config) {
  const auto before = corma::testing::listening_sockets();
  auto backend = ucx::Backend::create(config);
  EXPECT_TRUE(backend) << backend.error().message();
  auto after = corma::testing::listening_sockets();
  std::erase_if(after, [&before](const tcp::endpoint& e) { return std::ranges::count(before, e) != 0; });
  return after;
}

TEST(UcxListening, UntrustedTcpOpensNoSocket) {
  EXPECT_EQ(opened_by({.transport = ucx::Transport::tcp}), std::vector<tcp::endpoint>{});
}

TEST(UcxListening, SharedMemoryOpensNoSocket) {
  EXPECT_EQ(opened_by({.transport = ucx::Transport::shared_memory, .error_handling = ucx::ErrorHandling::none}),
            std::vector<tcp::endpoint>{});
}

TEST(UcxListening, TrustedTcpListensOnlyOnTheNamedInterface) {
  const auto opened = opened_by({.transport = ucx::Transport::tcp, .trusted_peers = true, .tcp_interface = "lo"});
  ASSERT_FALSE(opened.empty()) << "UCX over tcp listens for its peers";
  for (const auto& endpoint : opened) {
    EXPECT_EQ(endpoint.address(), boost::asio::ip::make_address("127.0.0.1")) << endpoint;
  }
}

}  // namespace
