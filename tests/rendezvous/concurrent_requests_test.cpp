// The owner works on one connection's requests concurrently: an acquire or a
// window waiting for its registration does not hold up the pulls, renewals
// and releases sent behind it, and concurrent requests still keep every
// limit (lease caps, one registration per object, one window move at a
// time) and never hand out bytes published over since.
// Played from a raw client, which sends requests without waiting for answers.
#include "rendezvous/rendezvous_fixture.hpp"

#include <cstring>
#include <map>
#include <set>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;

constexpr std::uint64_t MiB = 1 << 20;
constexpr auto io_timeout = std::chrono::seconds(5);

/// Sends a request without reading its answer; its id.
asio::awaitable<std::uint64_t> send(RawClient& client, rv::Message body) {
  rv::Frame frame{client.next++, std::move(body)};
  auto written = co_await client.connection->write(frame, io_timeout);
  if (!written) throw std::runtime_error(written.error().message());
  co_return frame.request_id;
}

/// The next frame the owner writes, whichever request it answers.
asio::awaitable<rv::Frame> next_answer(RawClient& client) {
  auto frame = co_await client.connection->read(io_timeout);
  if (!frame) throw std::runtime_error(frame.error().message());
  co_return std::move(frame).value();
}

/// A lease of "small", lent in chunks.
asio::awaitable<std::uint64_t> chunked_lease(RawClient& client) {
  auto acquire = message(rv::Acquire{"small", false});
  auto chunked = co_await client.ask(std::move(acquire));
  co_return std::get<rv::Chunked>(chunked.value()).lease;
}

TEST_F(Rendezvous, ASlowRegistrationDoesNotHoldUpTheRequestsBehindIt) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    const auto lease = co_await chunked_lease(client);

    // The owner's registration of "big" is held in its backend: the pull
    // and the renewal sent after it are answered meanwhile, in order.
    owner_backend->hold_maps();
    auto acquire = message(rv::Acquire{"big", true});
    const auto acquire_id = co_await send(client, std::move(acquire));
    auto pull = message(rv::Pull{lease, 0, 100});
    const auto pull_id = co_await send(client, std::move(pull));
    auto renew = message(rv::Renew{lease});
    const auto renew_id = co_await send(client, std::move(renew));
    auto pulled = co_await next_answer(client);
    EXPECT_EQ(pulled.request_id, pull_id) << "the pull waited for the registration";
    auto* data = std::get_if<rv::Data>(&pulled.message);
    EXPECT_TRUE(data != nullptr && data->bytes.size() == 100U &&
                std::memcmp(data->bytes.data(), small.data(), 100) == 0);
    auto renewed = co_await next_answer(client);
    EXPECT_EQ(renewed.request_id, renew_id);
    EXPECT_TRUE(std::holds_alternative<rv::Renewed>(renewed.message));
    EXPECT_EQ(owner->stats().exports_registered, 0U) << "the registration is still held";

    owner_backend->release_maps();
    auto granted = co_await next_answer(client);
    EXPECT_EQ(granted.request_id, acquire_id);
    auto* grant = std::get_if<rv::RdmaGrant>(&granted.message);
    EXPECT_TRUE(grant != nullptr && grant->size == big.size());
    EXPECT_EQ(owner->stats().live_leases, 2U);
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

TEST_F(Rendezvous, AcquiresUnderWayCountAgainstTheLeaseCapAndShareOneRegistration) {
  start_owner(64 << 20, corma::OwnerConfig{.max_leases_per_connection = 2});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    owner_backend->hold_maps();
    auto acquire1 = message(rv::Acquire{"big", true});
    const auto first = co_await send(client, std::move(acquire1));
    auto acquire2 = message(rv::Acquire{"big", true});
    const auto second = co_await send(client, std::move(acquire2));
    auto acquire3 = message(rv::Acquire{"big", true});
    const auto third = co_await send(client, std::move(acquire3));
    // Two acquires are under way (waiting for one registration): the third
    // is over the cap, and told so at once.
    auto refused = co_await next_answer(client);
    EXPECT_EQ(refused.request_id, third);
    auto* error = std::get_if<rv::ErrorReply>(&refused.message);
    EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::budget_exceeded));

    owner_backend->release_maps();
    std::set<std::uint64_t> answered;
    std::set<std::vector<std::byte>> descriptors;
    for (int i = 0; i < 2; ++i) {
      auto frame = co_await next_answer(client);
      answered.insert(frame.request_id);
      if (auto* grant = std::get_if<rv::RdmaGrant>(&frame.message)) descriptors.insert(grant->descriptor);
    }
    EXPECT_EQ(answered, (std::set<std::uint64_t>{first, second}));
    EXPECT_EQ(descriptors.size(), 1U) << "both leases read the same registration";
    EXPECT_EQ(owner->stats().exports_registered, 1U);
    EXPECT_EQ(owner->stats().live_leases, 2U);
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

TEST_F(Rendezvous, AnObjectPublishedAgainWhileItRegistersIsRegisteredAfreshForLaterAcquires) {
  start_owner();
  const auto replacement = pattern(big.size(), 77);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    owner_backend->hold_maps();
    auto acquire_old = message(rv::Acquire{"big", true});
    const auto old_id = co_await send(client, std::move(acquire_old));
    (void)co_await until([&] { return owner_backend->wait_for_held_maps(1, std::chrono::milliseconds(0)); },
                         std::chrono::seconds(5));
    // Published again while the first registration is held: the second
    // acquire waits for it, then must not read the old bytes.
    owner->publish("big", corma::PublishedObject{replacement, nullptr});
    auto acquire_new = message(rv::Acquire{"big", true});
    const auto new_id = co_await send(client, std::move(acquire_new));
    owner_backend->release_maps();
    std::map<std::uint64_t, std::vector<std::byte>> descriptors;
    for (int i = 0; i < 2; ++i) {
      auto frame = co_await next_answer(client);
      if (auto* grant = std::get_if<rv::RdmaGrant>(&frame.message)) descriptors[frame.request_id] = grant->descriptor;
    }
    EXPECT_EQ(descriptors.size(), 2U);
    EXPECT_NE(descriptors[old_id], descriptors[new_id]) << "the second lease reads the new bytes";
    auto acquire_again = message(rv::Acquire{"big", true});
    auto again = co_await client.ask(std::move(acquire_again));
    auto* grant = again ? std::get_if<rv::RdmaGrant>(&again.value()) : nullptr;
    EXPECT_TRUE(grant != nullptr && grant->descriptor == descriptors[new_id]) << "the new export is the one kept";
    EXPECT_EQ(owner->stats().exports_registered, 2U);
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

TEST_F(Rendezvous, AResolverThatThrowsIsAnsweredAndTheConnectionServesOn) {
  start_owner();
  owner->set_resolver([](std::string_view) -> corma::Result<corma::PublishedObject> {
    throw std::runtime_error("the disk went away");
  });
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    auto unknown = message(rv::Acquire{"not-published", true});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(unknown)), errc::backend));
    auto known = message(rv::Acquire{"small", false});
    auto chunked = co_await client.ask(std::move(known));
    EXPECT_TRUE(chunked && std::holds_alternative<rv::Chunked>(chunked.value()));
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

TEST_F(Rendezvous, AConnectionClosedWhileItsAcquireRegistersLeavesNoLease) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    owner_backend->hold_maps();
    auto acquire = message(rv::Acquire{"big", true});
    (void)co_await send(client, std::move(acquire));
    (void)co_await until([&] { return owner_backend->held_maps() == 1; }, std::chrono::seconds(5));
    EXPECT_EQ(owner_backend->held_maps(), 1U) << "the acquire never reached its registration";
    client.connection->close();
    // The owner notices the close while the registration is held, and
    // keeps the connection until its acquire has answered.
    EXPECT_EQ(owner->stats().open_connections, 1U);
    owner_backend->release_maps();
    (void)co_await until([&] { return owner->stats().open_connections == 0; }, std::chrono::seconds(5));
    EXPECT_EQ(owner->stats().open_connections, 0U);
    EXPECT_EQ(owner->stats().live_leases, 0U) << "the lease went with its connection";
    EXPECT_EQ(owner->stats().exports_registered, 1U);
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

TEST_F(Rendezvous, AWindowAskedAgainWhileItsRegistrationRunsIsRefusedAndTheFirstServed) {
  std::vector<std::byte> huge = pattern(10 * MiB, 7);
  start_owner(4 * MiB);
  owner->publish("huge", corma::PublishedObject{huge, nullptr});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    auto acquire = message(rv::Acquire{"huge", true});
    auto acquired = co_await client.ask(std::move(acquire));
    const auto window = std::get<rv::RdmaWindow>(acquired.value());
    const auto end = window.offset + window.window_len;

    owner_backend->hold_maps();
    auto next_window = message(rv::NextWindow{window.lease, end});
    const auto first = co_await send(client, std::move(next_window));
    auto next_again = message(rv::NextWindow{window.lease, end});
    const auto again = co_await send(client, std::move(next_again));
    auto refused = co_await next_answer(client);
    EXPECT_EQ(refused.request_id, again);
    auto* error = std::get_if<rv::ErrorReply>(&refused.message);
    EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::out_of_range));

    owner_backend->release_maps();
    auto moved = co_await next_answer(client);
    EXPECT_EQ(moved.request_id, first);
    auto* second = std::get_if<rv::RdmaWindow>(&moved.message);
    EXPECT_TRUE(second != nullptr && second->offset == end && second->lease == window.lease);
    EXPECT_LE(owner_registry->stats().registered_bytes, 4 * MiB);
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

TEST_F(Rendezvous, AClientCannotHaveMoreRequestsWorkedOnThanTheOwnerAllows) {
  start_owner(64 << 20, corma::OwnerConfig{.max_requests_in_flight = 2});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    const auto lease = co_await chunked_lease(client);
    // Two held acquires fill the connection's requests in flight: the
    // renewal behind them is not read until one of them is answered.
    owner_backend->hold_maps();
    auto acquire1 = message(rv::Acquire{"big", true});
    (void)co_await send(client, std::move(acquire1));
    auto acquire2 = message(rv::Acquire{"big", true});
    (void)co_await send(client, std::move(acquire2));
    auto renew = message(rv::Renew{lease});
    const auto renew_id = co_await send(client, std::move(renew));
    owner_backend->release_maps();
    std::vector<std::uint64_t> order;
    for (int i = 0; i < 3; ++i) {
      auto frame = co_await next_answer(client);
      order.push_back(frame.request_id);
    }
    EXPECT_NE(order.front(), renew_id) << "the renewal was read only once an acquire was answered";
    EXPECT_EQ(std::set<std::uint64_t>(order.begin(), order.end()).size(), 3U) << "every request is answered";
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

}  // namespace

TEST_F(Rendezvous, WithTheOwnersRegistrationsCachedAGrantsKeyStillReachesOnlyItsObject) {
  owner_registry_config.cache_registrations = true;
  start_owner();
  // An object inside another, both above the RDMA threshold.
  const std::span<const std::byte> inner(big.data() + 4096, 100 * 1024);
  owner->publish("inner", corma::PublishedObject{inner, nullptr});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    auto descriptor_of = [&](const char* name) -> asio::awaitable<corma::RemoteRegion> {
      auto acquire = message(rv::Acquire{name, true});
      auto granted = co_await client.ask(std::move(acquire));
      auto* grant = granted ? std::get_if<rv::RdmaGrant>(&granted.value()) : nullptr;
      if (grant == nullptr) throw std::runtime_error(std::string("no grant for ") + name);
      co_return corma::decode_descriptor(grant->descriptor).value();
    };
    const auto whole = co_await descriptor_of("big");
    const auto part = co_await descriptor_of("inner");
    EXPECT_EQ(part.addr, reinterpret_cast<std::uint64_t>(inner.data()));
    EXPECT_EQ(part.len, inner.size());
    EXPECT_NE(part.packed_key, whole.packed_key) << "the key granted for inner reaches all of big";
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
  EXPECT_EQ(owner_registry->stats().registrations, 2U);
  EXPECT_EQ(owner_registry->stats().cache_hits, 0U);
}
