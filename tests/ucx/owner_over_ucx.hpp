// An owner over a real UCX backend (a parameter of ucx_peer_settings())
// serving "big", 1 MiB of a known pattern, on loopback.
#pragma once

#include "ucx/settings.hpp"

#include <corma/owner.hpp>
#include <corma/registry.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

namespace corma::testing {

inline std::shared_ptr<Registry> registry_over(const ucx::Config& config) {
  return std::make_shared<Registry>(make_ucx(config), RegistryConfig{1 << 30, 0});
}

class OwnerOverUcxTest : public ::testing::TestWithParam<UcxSetting> {
 protected:
  explicit OwnerOverUcxTest(OwnerConfig config = {}) : owner{io.get_executor(), owner_registry, config} {}

  boost::asio::io_context io;
  std::shared_ptr<Registry> owner_registry = registry_over(GetParam().config);
  Owner owner;
  boost::asio::ip::tcp::acceptor acceptor{io, {boost::asio::ip::make_address("127.0.0.1"), 0}};
  std::vector<std::byte> big = std::vector<std::byte>(1 << 20);

  void SetUp() override {
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 7 + 5);
    owner.publish("big", PublishedObject{big, nullptr});
    boost::asio::co_spawn(io, owner.serve(acceptor), boost::asio::detached);
  }
  void TearDown() override {
    owner.stop();
    acceptor.close();
    io.restart();
    io.run_for(std::chrono::seconds(2));
  }
};

}  // namespace corma::testing
