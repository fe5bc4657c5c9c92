// Push fetches over real UCX backends (shared memory, trusted tcp): the
// owner's backend connects a peer towards the consumer's, writes the
// object into the consumer's landing and notifies; the landing's other
// bytes stay as they were.
#include "support/run.hpp"
#include "ucx/owner_over_ucx.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>
#include <corma/ucx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <algorithm>

namespace {

namespace asio = boost::asio;
using corma::testing::UcxSetting;

class PushOverUcx : public corma::testing::OwnerOverUcxTest {
 protected:
  PushOverUcx() : OwnerOverUcxTest(pushing()) {}

  static corma::OwnerConfig pushing() {
    corma::OwnerConfig config;
    config.accept_push = true;
    return config;
  }

  std::shared_ptr<corma::Registry> consumer_registry = corma::testing::registry_over(GetParam().config);
};

TEST_P(PushOverUcx, TheObjectLandsWhereOfferedAndItsNotificationFindsItThere) {
  constexpr auto sentinel = std::byte{0xEE};
  std::vector<std::byte> memory(big.size() + 8192, sentinel);
  auto landing = corma::testing::run(io, consumer_registry->async_register(memory, corma::Access::remote_read_write,
                                                                           asio::use_awaitable))
                     .value();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry);
    EXPECT_TRUE(consumer) << consumer.error().message();
    if (!consumer) co_return;
    for (std::uint64_t round = 0; round < 3; ++round) {
      std::fill(memory.begin(), memory.end(), sentinel);
      corma::PushOptions options{4096, round};
      auto outcome = co_await consumer.value()->async_push_fetch("big", landing, options);
      EXPECT_TRUE(outcome && outcome.value().pushed) << (outcome ? outcome.value().push_refusal
                                                                  : outcome.error().message());
      auto note = co_await consumer_registry->backend()->async_receive_notification(asio::use_awaitable);
      EXPECT_TRUE(note && note.value().tag == round);
      EXPECT_TRUE(std::equal(big.begin(), big.end(), memory.begin() + 4096)) << "round " << round;
      EXPECT_TRUE(std::all_of(memory.begin(), memory.begin() + 4096, [&](std::byte b) { return b == sentinel; }));
      EXPECT_TRUE(std::all_of(memory.begin() + 4096 + static_cast<std::ptrdiff_t>(big.size()), memory.end(),
                              [&](std::byte b) { return b == sentinel; }));
    }
  }());
  EXPECT_EQ(owner.stats().pushes, 3U);
}

INSTANTIATE_TEST_SUITE_P(Transports, PushOverUcx, ::testing::ValuesIn(corma::testing::ucx_peer_settings()),
                         corma::testing::UcxSettingName{});

}  // namespace
