// The rendezvous owner's handshake over real UCX backends: a raw client's
// hello with a hostile peer offer gets `hello_ok` without a backend, the
// owner goes on serving, and a real consumer still reads over RDMA. Over
// untrusted tcp no offer is made or taken at all.
#include "support/raw_client.hpp"
#include "support/run.hpp"
#include "ucx/hostile_offers.hpp"
#include "ucx/owner_over_ucx.hpp"
#include "ucx/settings.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>
#include <corma/ucx.hpp>

#include "wire.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <cstring>

namespace {

namespace asio = boost::asio;
namespace rv = corma::rendezvous;
namespace ucx = corma::ucx;
using corma::Path;
using corma::testing::message;
using corma::testing::RawClient;

using corma::testing::UcxSetting;

using corma::testing::registry_over;

class OwnerOverUcx : public corma::testing::OwnerOverUcxTest {
 protected:
  /// A consumer over a backend like the owner's fetches "big".
  asio::awaitable<corma::Result<corma::Fetched>> fetch_big(std::shared_ptr<corma::Registry> registry) {
    auto consumer = co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(), registry);
    if (!consumer) co_return std::move(consumer).error();
    co_return co_await consumer.value()->async_fetch("big");
  }
};

/// What the owner answers a raw hello offering `offer` for UCX.
asio::awaitable<corma::Result<rv::Message>> hello(asio::ip::tcp::endpoint owner, std::vector<std::byte> offer) {
  auto client = co_await RawClient::connect(owner);
  auto request = message(rv::Hello{rv::protocol_version, ucx::backend_id, std::move(offer)});
  co_return co_await client.ask(std::move(request));
}

TEST_P(OwnerOverUcx, HostileOffersGetNoPeerAndConsumersAreStillServed) {
  auto consumer_registry = registry_over(GetParam().config);
  const auto address =
      owner_registry->backend()->async_peer_accept(ucx::wire::encode_offer(), asio::use_future).get().value();
  EXPECT_TRUE(owner_registry->backend()->async_peer_close(address.peer, asio::use_future).get());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    for (const auto& offer : corma::testing::hostile_offers(address.blob)) {
      auto reply = co_await hello(acceptor.local_endpoint(), offer.bytes);
      if (offer.bytes.size() > corma::max_peer_blob_size) {
        // The frame decoder refuses it first: the connection is closed.
        EXPECT_FALSE(reply) << offer.what << " was answered";
        continue;
      }
      EXPECT_TRUE(reply) << offer.what << ": " << reply.error().message();
      auto* ok = reply ? std::get_if<rv::HelloOk>(&reply.value()) : nullptr;
      EXPECT_NE(ok, nullptr) << offer.what << ": no hello_ok";
      if (ok == nullptr) continue;
      EXPECT_EQ(ok->backend, corma::BackendId::none) << offer.what << " was taken";
      EXPECT_TRUE(ok->peer_answer.empty()) << offer.what;
    }
    // A well-formed offer from a raw client is taken (and forgotten when it
    // hangs up), and a real consumer is served over RDMA.
    auto taken = co_await hello(acceptor.local_endpoint(), ucx::wire::encode_offer());
    EXPECT_TRUE(taken && std::get<rv::HelloOk>(taken.value()).backend == ucx::backend_id);
    auto fetched = co_await fetch_big(consumer_registry);
    EXPECT_TRUE(fetched) << fetched.error().message();
    if (!fetched) co_return;
    EXPECT_EQ(fetched.value().path, Path::rdma);
    EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);
  }());
}

INSTANTIATE_TEST_SUITE_P(Transports, OwnerOverUcx, ::testing::ValuesIn(corma::testing::ucx_peer_settings()),
                         corma::testing::UcxSettingName{});

class UntrustedOwner : public OwnerOverUcx {};

TEST_P(UntrustedOwner, TakesNoOfferAndServesChunks) {
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto reply = co_await hello(acceptor.local_endpoint(), ucx::wire::encode_offer());
    EXPECT_TRUE(reply && std::get<rv::HelloOk>(reply.value()).backend == corma::BackendId::none);
    // A consumer over untrusted tcp offers nothing and reads in chunks.
    auto fetched = co_await fetch_big(registry_over(GetParam().config));
    EXPECT_TRUE(fetched) << fetched.error().message();
    if (!fetched) co_return;
    EXPECT_EQ(fetched.value().path, Path::chunked);
    EXPECT_EQ(fetched.value().reason, corma::ChunkedReason::no_offer);
    EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);
  }());
}

INSTANTIATE_TEST_SUITE_P(Default, UntrustedOwner, ::testing::Values(UcxSetting{"tcp", {}}),
                         corma::testing::UcxSettingName{});

}  // namespace
