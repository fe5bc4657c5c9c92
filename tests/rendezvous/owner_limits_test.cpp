// What a greedy or slow client can do to an Owner, and what a republished
// object does to a consumer reading it: each limit holds and is refused
// clearly, and the owner keeps serving everyone else.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <cstring>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;
using corma::Path;

/// Waits (running the owner) until the peer closes `socket`; how long it took.
asio::awaitable<std::chrono::milliseconds> until_closed(asio::ip::tcp::socket& socket) {
  const auto start = std::chrono::steady_clock::now();
  std::array<std::byte, 64> sink{};
  for (;;) {
    auto [ec, n] = co_await socket.async_read_some(asio::buffer(sink), asio::as_tuple(asio::use_awaitable));
    if (ec) break;
  }
  co_return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}

asio::awaitable<asio::ip::tcp::socket> raw_socket(asio::ip::tcp::endpoint endpoint) {
  asio::ip::tcp::socket socket(co_await asio::this_coro::executor);
  co_await socket.async_connect(endpoint, asio::use_awaitable);
  co_return socket;
}

/// A raw client past its hello.
asio::awaitable<RawClient> said_hello(asio::ip::tcp::endpoint endpoint) {
  auto client = co_await RawClient::connect(endpoint);
  auto hello = message(rv::Hello{});
  EXPECT_TRUE(co_await client.ask(std::move(hello)));
  co_return client;
}

corma::OwnerConfig quick_timeouts() {
  corma::OwnerConfig config;
  config.io_timeout = std::chrono::milliseconds(300);
  config.idle_timeout = std::chrono::seconds(30);
  return config;
}

TEST_F(Rendezvous, AHalfSentFrameIsClosedAtTheIoTimeoutNotTheIdleOne) {
  start_owner(64 << 20, quick_timeouts());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello = message(rv::Hello{});
    EXPECT_TRUE(co_await client.ask(std::move(hello)));
    // A whole frame's prefix and a few bytes of its body, then silence.
    auto bytes = rv::encode_frame(rv::Frame{2, rv::Acquire{"small", false}});
    co_await asio::async_write(client.connection->socket(), asio::buffer(bytes.data(), 7), asio::use_awaitable);
    const auto waited = co_await until_closed(client.connection->socket());
    EXPECT_GE(waited, std::chrono::milliseconds(250));
    EXPECT_LT(waited, std::chrono::seconds(5)) << "held for the idle timeout";
  }());
}

TEST_F(Rendezvous, SilentConnectionsPastTheHandshakeCapAreRefusedAndOthersStillServed) {
  auto config = quick_timeouts();
  config.max_handshakes = 2;
  start_owner(64 << 20, config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto silent1 = co_await raw_socket(acceptor.local_endpoint());
    auto silent2 = co_await raw_socket(acceptor.local_endpoint());
    // Let the owner accept both before the third arrives.
    asio::steady_timer settle(io);
    while (owner->stats().connections < 2) {
      settle.expires_after(std::chrono::milliseconds(5));
      co_await settle.async_wait(asio::use_awaitable);
    }
    auto third = co_await RawClient::connect(acceptor.local_endpoint());
    auto refused = co_await third.connection->read(std::chrono::seconds(5));
    auto* error = refused ? std::get_if<rv::ErrorReply>(&refused.value().message) : nullptr;
    EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::budget_exceeded));
    EXPECT_EQ(owner->stats().refused_connections, 1u);
    // The silent ones go at the io timeout; then a consumer is served.
    co_await until_closed(silent1);
    co_await until_closed(silent2);
    auto consumer = (co_await connect(consumer_registry)).value();
    auto fetched = co_await consumer->async_fetch("small");
    EXPECT_TRUE(fetched) << fetched.error().message();
  }());
}

TEST_F(Rendezvous, ConnectionsPastTheCapAreRefusedUntilOneCloses) {
  auto config = quick_timeouts();
  config.max_connections = 2;
  start_owner(64 << 20, config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto first = (co_await connect(consumer_registry)).value();
    auto second = (co_await connect(nullptr)).value();
    auto third = co_await connect(nullptr);
    EXPECT_FALSE(third);
    if (third) co_return;
    EXPECT_TRUE(third.error().is(errc::budget_exceeded)) << third.error().message() << " / " << third.error().detail;
    EXPECT_NE(third.error().detail.find("too many connections"), std::string::npos) << third.error().message();
    second.reset();
    // The owner notices the close on its next read; retry until it has.
    std::unique_ptr<corma::Consumer> replacement;
    asio::steady_timer pause(io);
    for (int attempt = 0; attempt < 200 && !replacement; ++attempt) {
      auto again = co_await connect(nullptr);
      if (again) replacement = std::move(again).value();
      pause.expires_after(std::chrono::milliseconds(5));
      if (!replacement) co_await pause.async_wait(asio::use_awaitable);
    }
    EXPECT_TRUE(replacement);
    if (!replacement) co_return;
    auto fetched = co_await replacement->async_fetch("small");
    EXPECT_TRUE(fetched) << fetched.error().message();
  }());
}

TEST_F(Rendezvous, TheOwnerWideLeaseCapIsRefusedClearly) {
  auto config = quick_timeouts();
  config.max_leases = 4;
  start_owner(64 << 20, config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    std::vector<RawClient> clients;
    for (int i = 0; i < 4; ++i) clients.push_back(co_await said_hello(acceptor.local_endpoint()));
    for (auto& client : clients) {  // one lease each: within every share
      auto acquire = message(rv::Acquire{"small", false});
      auto granted = co_await client.ask(std::move(acquire));
      EXPECT_TRUE(granted && std::holds_alternative<rv::Chunked>(granted.value()));
    }
    auto acquire = message(rv::Acquire{"small", false});
    auto refused = co_await clients.front().ask(std::move(acquire));
    EXPECT_TRUE(is_error(refused, errc::budget_exceeded));
    auto* error = refused ? std::get_if<rv::ErrorReply>(&refused.value()) : nullptr;
    EXPECT_TRUE(error != nullptr && error->detail.find("maximum of 4 leases") != std::string::npos);
    EXPECT_EQ(owner->stats().live_leases, 4u);
  }());
}

TEST_F(Rendezvous, PastHalfTheOwnersLeasesAConnectionHoldingItsShareIsRefusedAndANewcomerServed) {
  auto config = quick_timeouts();
  config.max_leases = 8;
  start_owner(64 << 20, config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto greedy = co_await said_hello(acceptor.local_endpoint());
    auto newcomer = co_await said_hello(acceptor.local_endpoint());
    auto ask = [](RawClient& client) -> asio::awaitable<corma::Result<rv::Message>> {
      auto acquire = message(rv::Acquire{"small", false});
      co_return co_await client.ask(std::move(acquire));
    };
    // Half the owner's leases go to whoever asks first...
    for (int i = 0; i < 4; ++i) {
      auto granted = co_await ask(greedy);
      EXPECT_TRUE(granted && std::holds_alternative<rv::Chunked>(granted.value()));
    }
    // ...the other half is shared: 8 / (2 x 2 connections) = 2 each.
    auto refused = co_await ask(greedy);
    EXPECT_TRUE(is_error(refused, errc::budget_exceeded));
    auto* error = refused ? std::get_if<rv::ErrorReply>(&refused.value()) : nullptr;
    EXPECT_TRUE(error != nullptr && error->detail.find("share") != std::string::npos);
    for (int i = 0; i < 2; ++i) {
      auto granted = co_await ask(newcomer);
      EXPECT_TRUE(granted && std::holds_alternative<rv::Chunked>(granted.value())) << "the newcomer found no room";
    }
    EXPECT_TRUE(is_error(co_await ask(newcomer), errc::budget_exceeded));
    EXPECT_EQ(owner->stats().live_leases, 6u);
  }());
}

TEST_F(Rendezvous, ForgedRenewsAndUnsupportedVersionsAreCountedAsRefused) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto a = co_await said_hello(acceptor.local_endpoint());
    auto b = co_await said_hello(acceptor.local_endpoint());
    auto acquire = message(rv::Acquire{"small", false});
    auto granted = co_await a.ask(std::move(acquire));
    const auto lease = std::get<rv::Chunked>(granted.value()).lease;
    const auto before = owner->stats().refused_requests;
    // b renews a's lease, then one that does not exist: both refused.
    auto forged = message(rv::Renew{lease});
    EXPECT_TRUE(is_error(co_await b.ask(std::move(forged)), errc::region_not_found));
    auto unknown = message(rv::Renew{lease + 1000});
    EXPECT_TRUE(is_error(co_await b.ask(std::move(unknown)), errc::region_not_found));
    // a renewing its own lease is no refusal.
    auto own = message(rv::Renew{lease});
    auto renewed = co_await a.ask(std::move(own));
    EXPECT_TRUE(renewed && std::holds_alternative<rv::Renewed>(renewed.value()));
    EXPECT_EQ(owner->stats().refused_requests, before + 2);
    // A hello in a protocol version this owner does not speak.
    auto c = co_await RawClient::connect(acceptor.local_endpoint());
    rv::Hello older;
    older.version = rv::oldest_protocol_version - 1;
    auto hello = message(std::move(older));
    EXPECT_TRUE(is_error(co_await c.ask(std::move(hello)), errc::protocol));
    EXPECT_EQ(owner->stats().refused_requests, before + 3);
  }());
}

/// A consumer whose progress callback republishes `name` halfway through.
corma::ConsumerConfig republishing_midway(corma::Owner*& owner, const std::vector<std::byte>& replacement) {
  corma::ConsumerConfig config;
  config.on_progress = [&owner, &replacement](std::uint64_t, std::uint64_t) {
    owner->publish("big", corma::PublishedObject{replacement, nullptr});
  };
  return config;
}

TEST_F(Rendezvous, AnObjectRepublishedDuringAChunkedReadFailsTheFetchAsChanged) {
  start_owner();
  const auto replacement = pattern(big.size(), 9);
  corma::Owner* owner_ptr = owner.get();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(), nullptr,
                                                       republishing_midway(owner_ptr, replacement)))
                        .value();
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_TRUE(!fetched && fetched.error().is(errc::object_changed))
        << (fetched ? std::string("succeeded") : fetched.error().message());
  }());
  EXPECT_EQ(owner->stats().live_leases, 0u) << "the lease still ends";
}

TEST_F(Rendezvous, AnObjectRepublishedDuringAnRdmaReadFailsTheFetchAsChanged) {
  start_owner();
  const auto replacement = pattern(big.size(), 9);
  corma::Owner* owner_ptr = owner.get();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(),
                                                       consumer_registry, republishing_midway(owner_ptr, replacement)))
                        .value();
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_TRUE(!fetched && fetched.error().is(errc::object_changed))
        << (fetched ? std::string("succeeded") : fetched.error().message());
    // The next fetch reads the new publication whole.
    auto plain = (co_await connect(consumer_registry)).value();
    auto again = co_await plain->async_fetch("big");
    EXPECT_TRUE(again) << again.error().message();
    if (!again) co_return;
    EXPECT_EQ(again.value().path, Path::rdma);
    EXPECT_EQ(std::memcmp(again.value().data.data(), replacement.data(), replacement.size()), 0);
  }());
}

}  // namespace

TEST_F(Rendezvous, AClientThatPipelinesPullsAndNeverReadsTheAnswersIsClosedAtTheIoTimeout) {
  start_owner(64 << 20, quick_timeouts());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await said_hello(acceptor.local_endpoint());
    auto acquire = message(rv::Acquire{"big", false});
    auto granted = co_await client.ask(std::move(acquire));
    auto* chunked = granted ? std::get_if<rv::Chunked>(&granted.value()) : nullptr;
    EXPECT_TRUE(chunked != nullptr) << "the acquire was not answered with chunks";
    if (chunked == nullptr) co_return;
    // Many whole-chunk pulls on the wire (megabytes of answers), none read.
    const std::uint64_t lease = chunked->lease;
    const std::uint32_t chunk = chunked->chunk_size;
    for (std::uint64_t offset = 0; offset + chunk <= big.size(); offset += chunk) {
      for (int again = 0; again < 16; ++again) {
        rv::Frame pull{client.next++, rv::Pull{lease, offset, chunk}};
        auto written = co_await client.connection->write(pull, std::chrono::seconds(5));
        EXPECT_TRUE(written) << written.error().message();
        if (!written) co_return;
      }
    }
    // The owner's answers fill the socket; a write that cannot finish within
    // its io timeout closes the connection (the client never read a byte).
    const auto waited = co_await until([&] { return owner->stats().open_connections == 0; }, std::chrono::seconds(10));
    EXPECT_EQ(owner->stats().open_connections, 0u) << "the owner still holds the connection";
    EXPECT_LT(waited, std::chrono::seconds(5));
    EXPECT_EQ(owner->stats().live_leases, 0u) << "the closed connection's lease was kept";
    // Everyone else is still served.
    auto consumer = (co_await connect(consumer_registry)).value();
    auto fetched = co_await consumer->async_fetch("small");
    EXPECT_TRUE(fetched) << fetched.error().message();
  }());
}
