// Owner and Consumer over loopback TCP, with the in-process test backend:
// the fallback rules, leases, and what a hostile client gets.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <numeric>

namespace {

using namespace corma::testing::rendezvous;

using corma::Consumer;
using corma::errc;
using corma::Owner;
using corma::Path;
using corma::Registry;
using corma::testing::TestBackend;
using corma::testing::TestBackendFaults;

TEST_F(Rendezvous, LargeObjectGoesOverRdmaAndSmallOneInChunks) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    EXPECT_TRUE(consumer->rdma_ready());
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_TRUE(fetched) << fetched.error().message();
    EXPECT_EQ(fetched.value().path, Path::rdma);
    EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);
    auto little = co_await consumer->async_fetch("small");
    EXPECT_EQ(little.value().path, Path::chunked);
    EXPECT_EQ(little.value().reason, corma::ChunkedReason::below_threshold);
    EXPECT_EQ(std::memcmp(little.value().data.data(), small.data(), small.size()), 0);
    auto missing = co_await consumer->async_fetch("nope");
    EXPECT_TRUE(missing.error().is(errc::region_not_found));
  }());
  const auto stats = owner->stats();
  EXPECT_EQ(stats.decisions.rdma, 1u);
  EXPECT_EQ(stats.decisions.chunked_by_reason.at("below_threshold"), 1u);
  EXPECT_EQ(stats.not_found, 1u);
  EXPECT_EQ(stats.live_leases, 0u) << "every lease is released";
}

TEST_F(Rendezvous, SpentBudgetWithNoRoomForAWindowFallsBackToChunks) {
  start_owner(64 << 10);  // smaller than "big", and than the smallest window (1 MiB)
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_EQ(fetched.value().path, Path::chunked);
    EXPECT_EQ(fetched.value().reason, corma::ChunkedReason::no_window);
    EXPECT_FALSE(fetched.value().fell_back());
    EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);
  }());
  EXPECT_EQ(owner->stats().decisions.chunked_by_reason.at("no_window"), 1u);
}

TEST_F(Rendezvous, AnOwnerWithoutARegistryServesChunksAndStops) {
  // No registry: nothing registered, nothing cached, and stop() has nothing to invalidate.
  owner = std::make_unique<Owner>(io.get_executor(), nullptr);
  owner->publish("small", corma::PublishedObject{small, nullptr});
  owner->publish("small", corma::PublishedObject{small, nullptr});  // published again: no export to forget
  asio::co_spawn(io, owner->serve(acceptor), asio::detached);
  auto fetched = corma::testing::run(io, [&]() -> asio::awaitable<corma::Result<corma::Fetched>> {
    auto consumer = (co_await connect(consumer_registry)).value();
    co_return co_await consumer->async_fetch("small");
  }());
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().path, corma::Path::chunked);
  owner->stop();
}

TEST_F(Rendezvous, ConsumerWithoutAnOfferGetsChunks) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(nullptr)).value();
    EXPECT_FALSE(consumer->rdma_ready());
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_EQ(fetched.value().path, Path::chunked);
    EXPECT_EQ(fetched.value().reason, corma::ChunkedReason::no_offer);
    EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);
  }());
}

TEST_F(Rendezvous, FailedGetFallsBackExactlyOnce) {
  start_owner();
  consumer_backend->set_faults(TestBackendFaults{.fail_transfers = true});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_TRUE(fetched) << fetched.error().message();
    EXPECT_EQ(fetched.value().path, Path::chunked);
    EXPECT_TRUE(fetched.value().fell_back());
    EXPECT_EQ(fetched.value().reason, corma::ChunkedReason::rdma_failed) << fetched.value().failure;
    EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);
    EXPECT_EQ(consumer->stats().fallbacks, 1u);
    // A failed get's destination is deregistered in the background (the
    // fetch does not wait for a transfer that may not end): wait for it.
    asio::steady_timer wait(io);
    while (consumer_registry->stats().registered_bytes != 0) {
      wait.expires_after(std::chrono::milliseconds(1));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }());
  EXPECT_EQ(owner->stats().decisions.rdma, 1u) << "one grant, one fallback, no second acquire";
  EXPECT_EQ(owner->stats().live_leases, 0u);
  EXPECT_EQ(consumer_registry->stats().registered_bytes, 0u) << "the destination registration is gone";
}

TEST_F(Rendezvous, TheHeartbeatCarriesASlowTransferPastSeveralDeadlines) {
  start_owner(64 << 20, corma::OwnerConfig{.lease_timeout = std::chrono::milliseconds(120),
                                           .reap_interval = std::chrono::milliseconds(10)});
  consumer_backend->set_faults(TestBackendFaults{.transfer_delay = std::chrono::milliseconds(600)});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_EQ(fetched.value().path, Path::rdma);
    EXPECT_GE(consumer->stats().heartbeats, 4u);
  }());
  EXPECT_EQ(owner->stats().leases_expired, 0u);
}


TEST_F(Rendezvous, AnOlderProtocolVersionIsRefusedAndTheConnectionEnds) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto request1 = message(rv::Hello{rv::oldest_protocol_version - 1, {}, {}});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(request1)), errc::protocol));
    auto request2 = message(rv::Acquire{"small", false});
    EXPECT_FALSE(co_await client.ask(std::move(request2))) << "the connection stays open";
  }());
}

TEST_F(Rendezvous, ReaperFreesAnAbandonedLease) {
  start_owner(64 << 20, corma::OwnerConfig{.lease_timeout = std::chrono::milliseconds(50),
                                           .reap_interval = std::chrono::milliseconds(10)});
  std::optional<RawClient> client;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    client = co_await RawClient::connect(acceptor.local_endpoint());
    auto request1 = message(rv::Hello{});
    auto hello = co_await client->ask(std::move(request1));
    EXPECT_TRUE(hello && std::holds_alternative<rv::HelloOk>(hello.value()));
    auto request2 = message(rv::Acquire{"big", false});
    auto acquired = co_await client->ask(std::move(request2));
    EXPECT_TRUE(acquired && std::holds_alternative<rv::Chunked>(acquired.value()));
  }());
  EXPECT_EQ(owner->stats().live_leases, 1u);
  // The client stays connected and silent; only the reaper can free it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (owner->stats().leases_expired == 0 && std::chrono::steady_clock::now() < deadline) {
    io.run_one_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(owner->stats().leases_expired, 1u);
  EXPECT_EQ(owner->stats().live_leases, 0u);
  // A read of the region that has gone is refused.
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto request3 = message(rv::Pull{1, 0, 16});
    auto pulled = co_await client->ask(std::move(request3));
    EXPECT_TRUE(is_error(pulled, errc::region_not_found));
  }());
}

/// An owner that grants RDMA with a broken descriptor, then serves pulls.
asio::awaitable<int> lying_owner(asio::ip::tcp::acceptor& acceptor, std::shared_ptr<TestBackend> backend,
                                 const std::vector<std::byte>& object, std::vector<std::byte> descriptor) {
  auto socket = co_await acceptor.async_accept(asio::use_awaitable);
  rv::FramedConnection connection(std::move(socket), rv::default_max_frame_body);
  int acquires = 0;
  for (;;) {
    auto frame = co_await connection.read(std::chrono::seconds(5));
    if (!frame) co_return acquires;
    rv::Message reply = rv::Released{};
    auto& message = frame.value().message;
    if (auto* hello = std::get_if<rv::Hello>(&message)) {
      auto answer = co_await backend->async_peer_accept(hello->peer_offer, asio::use_awaitable);
      reply = rv::HelloOk{rv::protocol_version, corma::testing::test_backend_id, answer.value().blob,
                          rv::default_max_frame_body};
    } else if (std::holds_alternative<rv::Acquire>(message)) {
      ++acquires;
      reply = rv::RdmaGrant{7, object.size(), 10000, descriptor};
    } else if (auto* pull = std::get_if<rv::Pull>(&message)) {
      reply = rv::Data{pull->offset, std::vector<std::byte>(object.begin() + static_cast<long>(pull->offset),
                                                            object.begin() + static_cast<long>(pull->offset + pull->len))};
    }
    rv::Frame response{frame.value().request_id, std::move(reply)};
    co_await connection.write(response, std::chrono::seconds(5));
  }
}

TEST_F(Rendezvous, MalformedDescriptorsFallBackExactlyOnce) {
  auto valid = corma::encode(corma::RemoteRegion{corma::testing::test_backend_id, 1, 0x1000, big.size(), corma::PackedKey(40)});
  auto wrong_length = corma::encode(corma::RemoteRegion{corma::testing::test_backend_id, 1, 0x1000, 5, corma::PackedKey(40)});
  auto trailing = valid;
  trailing.push_back(std::byte{1});
  for (const auto& descriptor : {std::vector<std::byte>(13, std::byte{0xFF}), wrong_length, trailing}) {
    int acquires = -1;
    asio::co_spawn(io, lying_owner(acceptor, owner_backend, big, descriptor),
                   [&](std::exception_ptr, int n) { acquires = n; });
    corma::testing::run(io, [&]() -> asio::awaitable<void> {
      auto consumer = (co_await connect(consumer_registry)).value();
      auto fetched = co_await consumer->async_fetch("big");
      EXPECT_TRUE(fetched) << fetched.error().message();
      EXPECT_EQ(fetched.value().path, Path::chunked);
      EXPECT_TRUE(fetched.value().fell_back());
      EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);
      EXPECT_EQ(consumer->stats().fallbacks, 1u);
    }());
    io.restart();
    io.run_for(std::chrono::seconds(2));  // the lying owner sees the consumer go
    EXPECT_EQ(acquires, 1) << "one acquire, no second attempt";
  }
}

TEST_F(Rendezvous, HostileClientsAreRefusedAndOthersKeepBeingServed) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    // Garbage bytes: the connection is closed.
    {
      asio::ip::tcp::socket socket(io);
      co_await socket.async_connect(acceptor.local_endpoint(), asio::use_awaitable);
      std::vector<std::byte> garbage(64, std::byte{0x5A});
      co_await asio::async_write(socket, asio::buffer(garbage), asio::use_awaitable);
      std::array<std::byte, 16> sink{};
      auto [ec, n] = co_await socket.async_read_some(asio::buffer(sink), asio::as_tuple(asio::use_awaitable));
      EXPECT_TRUE(ec) << "the owner must close a connection that sends garbage";
    }
    // An oversized length prefix: refused before anything is read.
    {
      asio::ip::tcp::socket socket(io);
      co_await socket.async_connect(acceptor.local_endpoint(), asio::use_awaitable);
      const std::uint32_t huge = 0x7fffffff;
      co_await asio::async_write(socket, asio::buffer(&huge, sizeof huge), asio::use_awaitable);
      std::array<std::byte, 16> sink{};
      auto [ec, n] = co_await socket.async_read_some(asio::buffer(sink), asio::as_tuple(asio::use_awaitable));
      EXPECT_TRUE(ec);
    }
    // Forged and out-of-range pulls on a real connection.
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto request4 = message(rv::Hello{});
    EXPECT_TRUE(co_await client.ask(std::move(request4)));
    auto request5 = message(rv::Pull{424242, 0, 16});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(request5)), errc::region_not_found));
    auto request6 = message(rv::Acquire{"small", false});
    auto acquired = co_await client.ask(std::move(request6));
    const auto lease = std::get<rv::Chunked>(acquired.value()).lease;
    auto request7 = message(rv::Pull{lease, 990, 11});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(request7)), errc::out_of_range));
    auto request8 = message(rv::Pull{lease, ~std::uint64_t{0} - 4, 16});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(request8)), errc::out_of_range));
    auto request9 = message(rv::Pull{lease, 990, 10});
    auto inside = co_await client.ask(std::move(request9));
    EXPECT_EQ(std::get<rv::Data>(inside.value()).bytes.size(), 10u);
    // An owner-side message from a client ends the connection.
    auto request10 = message(rv::Data{0, {}});
    auto hostile = co_await client.ask(std::move(request10));
    EXPECT_TRUE(hostile);  // answered with an error...
    auto request11 = message(rv::Renew{lease});
    auto after = co_await client.ask(std::move(request11));
    EXPECT_FALSE(after);  // ...and then the connection is gone

    // Meanwhile a well-behaved consumer is served as usual.
    auto consumer = (co_await connect(consumer_registry)).value();
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_TRUE(fetched) << fetched.error().message();
  }());
  EXPECT_GE(owner->stats().refused_requests, 5u);
}

}  // namespace

// ---- warm fetches: nothing registered again on either side ---------------

TEST_F(Rendezvous, RepeatedFetchesIntoARegisteredRegionRegisterNothingAgain) {
  start_owner();
  std::vector<std::byte> landing(big.size() + 4096);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto destination =
        (co_await consumer_registry->async_register(landing, corma::Access::local, asio::use_awaitable)).value();
    const auto consumer_registrations = consumer_registry->stats().registrations;
    for (int i = 0; i < 3; ++i) {
      std::fill(landing.begin(), landing.end(), std::byte{0});
      auto fetched = co_await consumer->async_fetch_into("big", destination);
      EXPECT_TRUE(fetched) << fetched.error().message();
      EXPECT_EQ(fetched.value().path, Path::rdma);
      EXPECT_EQ(fetched.value().size, big.size());
      EXPECT_EQ(std::memcmp(landing.data(), big.data(), big.size()), 0);
    }
    EXPECT_EQ(consumer_registry->stats().registrations, consumer_registrations)
        << "a warm fetch registers nothing on the consumer";
    // Small objects still come in chunks, into the same region.
    auto little = co_await consumer->async_fetch_into("small", destination);
    EXPECT_EQ(little.value().path, Path::chunked);
    EXPECT_EQ(std::memcmp(landing.data(), small.data(), small.size()), 0);
  }());
  const auto stats = owner->stats();
  EXPECT_EQ(stats.exports_registered, 1u) << "the owner keeps a published object registered between leases";
  EXPECT_EQ(stats.decisions.rdma, 3u);
  EXPECT_EQ(stats.live_leases, 0u);
}

TEST_F(Rendezvous, ADestinationTooSmallIsRefusedAndTheLeaseReleased) {
  start_owner();
  std::vector<std::byte> landing(big.size() / 2);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto destination =
        (co_await consumer_registry->async_register(landing, corma::Access::local, asio::use_awaitable)).value();
    auto fetched = co_await consumer->async_fetch_into("big", destination);
    EXPECT_TRUE(!fetched && fetched.error().is(errc::out_of_range));
    EXPECT_TRUE(std::all_of(landing.begin(), landing.end(), [](std::byte b) { return b == std::byte{0}; }));
    // The connection is still good for the next fetch.
    auto little = co_await consumer->async_fetch_into("small", destination);
    EXPECT_TRUE(little) << little.error().message();
  }());
  EXPECT_EQ(owner->stats().live_leases, 0u);
}

TEST_F(Rendezvous, IdleCachedExportsMakeRoomForANewOne) {
  // Room for one of the two large objects at a time.
  start_owner(big.size() + 8192);
  auto other = pattern(big.size(), 9);
  owner->publish("other", corma::PublishedObject{other, nullptr});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto first = co_await consumer->async_fetch("big");
    EXPECT_EQ(first.value().path, Path::rdma);
    // "big" stays registered, idle: "other" needs its room and gets it.
    auto second = co_await consumer->async_fetch("other");
    EXPECT_EQ(second.value().path, Path::rdma) << second.value().reason_text();
    EXPECT_EQ(std::memcmp(second.value().data.data(), other.data(), other.size()), 0);
  }());
  const auto stats = owner->stats();
  EXPECT_EQ(stats.exports_evicted, 1u);
  EXPECT_EQ(stats.exports_registered, 2u);
}

TEST_F(Rendezvous, RepublishingANameServesTheNewBytes) {
  start_owner();
  auto first_bytes = pattern(big.size(), 9);
  owner->publish("other", corma::PublishedObject{first_bytes, nullptr});
  auto replacement = pattern(big.size(), 77);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto before = co_await consumer->async_fetch("other");
    EXPECT_EQ(std::memcmp(before.value().data.data(), first_bytes.data(), first_bytes.size()), 0);
    // New bytes under an old name are fetched, not the old registration's.
    owner->publish("other", corma::PublishedObject{replacement, nullptr});
    auto after = co_await consumer->async_fetch("other");
    EXPECT_EQ(after.value().path, Path::rdma);
    EXPECT_EQ(std::memcmp(after.value().data.data(), replacement.data(), replacement.size()), 0);
  }());
  EXPECT_EQ(owner->stats().exports_registered, 2u);
}

TEST_F(Rendezvous, CachedExportsLiveInTheOwnersRegistryAndGoWhenRepublishedOrStopped) {
  start_owner();
  auto other = pattern(big.size(), 9);
  owner->publish("other", corma::PublishedObject{other, nullptr});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    for (const char* name : {"big", "other", "big", "other"}) {
      auto fetched = co_await consumer->async_fetch(name);
      EXPECT_EQ(fetched.value().path, Path::rdma) << name;
    }
  }());
  EXPECT_EQ(owner->stats().exports_registered, 2u);
  const auto charge = [&](const std::vector<std::byte>& object) {
    return owner_registry->charge_for(object.data(), object.size());
  };
  auto stats = owner_registry->stats();
  EXPECT_EQ(stats.registrations, 2u);
  EXPECT_EQ(stats.cache_idle_bytes, charge(big) + charge(other)) << "no lease reads them: idle in the cache";

  const auto released = [](const corma::DeregisteredEvent& event) {
    return event.async_wait(asio::use_future).wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  };
  auto big_event = owner_registry->find_cached(big, corma::Access::remote_read).value().deregistered();
  auto other_event = owner_registry->find_cached(other, corma::Access::remote_read).value().deregistered();

  // Published again: the old registration of "big" is cached no more.
  owner->publish("big", corma::PublishedObject{big, nullptr});
  EXPECT_EQ(owner_registry->stats().cache_idle_bytes, charge(other));
  EXPECT_TRUE(owner_registry->find_cached(big, corma::Access::remote_read).error().is(errc::region_not_found));
  EXPECT_TRUE(released(big_event));

  // Stopped: nothing is lent again, so nothing stays registered for it.
  owner->stop();
  EXPECT_EQ(owner_registry->stats().cache_idle_bytes, 0u);
  EXPECT_TRUE(released(other_event));
  EXPECT_EQ(owner_registry->stats().regions, 0u);
  EXPECT_EQ(owner->stats().exports_evicted, 0u) << "invalidation is not eviction";
}

TEST_F(Rendezvous, WithoutTheExportCacheEveryLeaseRegistersAgain) {
  corma::OwnerConfig config;
  config.cache_exports = false;
  start_owner(64 << 20, config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    for (int i = 0; i < 2; ++i) {
      auto fetched = co_await consumer->async_fetch("big");
      EXPECT_EQ(fetched.value().path, Path::rdma);
    }
  }());
  EXPECT_EQ(owner->stats().exports_registered, 2u);
}

TEST_F(Rendezvous, AStreamedFetchHandsTheChunksOverInOrderAsTheyArrive) {
  corma::OwnerConfig config;
  config.chunk_size = 64 << 10;
  start_owner(64 << 20, config);
  CollectingSink collected;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(nullptr)).value();  // no offer: chunks
    auto outcome = co_await consumer->async_fetch_to("big", collected.sink());
    EXPECT_TRUE(outcome) << outcome.error().message();
    EXPECT_EQ(outcome.value().path, Path::chunked);
    EXPECT_EQ(outcome.value().size, big.size());
  }());
  EXPECT_TRUE(collected.in_order);
  EXPECT_EQ(collected.calls, big.size() / (64 << 10));
  EXPECT_EQ(collected.largest, std::size_t{64 << 10});
  EXPECT_EQ(collected.bytes, big);
  EXPECT_EQ(owner->stats().live_leases, 0u);
}

TEST_F(Rendezvous, AStreamedFetchOverRdmaHandsTheObjectOverWhole) {
  start_owner();
  CollectingSink collected;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto outcome = co_await consumer->async_fetch_to("big", collected.sink());
    EXPECT_TRUE(outcome) << outcome.error().message();
    EXPECT_EQ(outcome.value().path, Path::rdma);
  }());
  EXPECT_EQ(collected.calls, 1u);
  EXPECT_EQ(collected.bytes, big);
}

TEST_F(Rendezvous, ASinkErrorEndsTheFetchAndTheConnectionGoesOn) {
  corma::OwnerConfig config;
  config.chunk_size = 64 << 10;
  start_owner(64 << 20, config);
  std::size_t calls = 0;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(nullptr)).value();
    auto refused = co_await consumer->async_fetch_to(
        "big", [&calls](std::uint64_t, std::span<const std::byte>) -> corma::Result<void> {
          if (++calls == 3) return corma::fail(errc::not_owned, "the disk is full");
          return corma::success();
        });
    EXPECT_FALSE(refused);
    if (!refused) {
      EXPECT_TRUE(refused.error().is(errc::not_owned)) << refused.error().message();
    }
    // The pulls asked before the error were answered and read: the next
    // fetch talks on a connection in step.
    auto next = co_await consumer->async_fetch("small");
    EXPECT_TRUE(next) << next.error().message();
    if (next) {
      EXPECT_EQ(std::memcmp(next.value().data.data(), small.data(), small.size()), 0);
    }
  }());
  EXPECT_EQ(calls, 3u) << "the sink was called after it failed";
  EXPECT_EQ(owner->stats().live_leases, 0u) << "the failed fetch's lease was not released";
}

TEST_F(Rendezvous, AStoppedOwnerLetsItsIoContextRunOutOfWork) {
  start_owner();
  std::optional<RawClient> silent;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    auto fetched = co_await consumer->async_fetch("big");
    EXPECT_TRUE(fetched) << fetched.error().message();
    // A client that connected and says nothing: its session waits for a frame.
    silent = co_await RawClient::connect(acceptor.local_endpoint());
    auto request = message(rv::Hello{});
    auto hello = co_await silent->ask(std::move(request));
    EXPECT_TRUE(hello && std::holds_alternative<rv::HelloOk>(hello.value()));
  }());
  owner->stop();
  // Nothing of the owner's may keep the io_context busy: not its reaper,
  // not a session, not the accept loop (the acceptor itself stays open; it
  // is the caller's).
  io.restart();
  const auto start = std::chrono::steady_clock::now();
  io.run_for(std::chrono::seconds(5));
  EXPECT_TRUE(io.stopped()) << "the owner left work in its io_context after stop()";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(acceptor.is_open());
}
