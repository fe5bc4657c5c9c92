// The protocol's edge cases exactly as docs/protocol.md answers them ("Every
// refusal, exactly"): what each is answered, and whether the connection is
// kept.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/write.hpp>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;

/// A frame's bytes with a payload written by hand (what an encoder would refuse to write).
std::vector<std::byte> raw_frame(rv::MessageType type, std::uint64_t id, const std::vector<std::byte>& payload) {
  std::vector<std::byte> bytes;
  auto put = [&](std::uint64_t value, int size) {
    for (int i = 0; i < size; ++i) bytes.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xffU));
  };
  put(rv::frame_fixed_body + payload.size(), 4);
  put(static_cast<std::uint8_t>(type), 1);
  put(0, 3);
  put(id, 8);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

/// An acquire_many payload that says `count` names and carries `names`.
std::vector<std::byte> batch_payload(std::uint16_t count, const std::vector<std::string>& names) {
  std::vector<std::byte> payload{static_cast<std::byte>(count & 0xff), static_cast<std::byte>(count >> 8),
                                 std::byte{0}};
  for (const auto& name : names) {
    payload.push_back(static_cast<std::byte>(name.size() & 0xff));
    payload.push_back(static_cast<std::byte>(name.size() >> 8));
    for (char c : name) payload.push_back(static_cast<std::byte>(c));
  }
  return payload;
}

class ProtocolEdges : public Rendezvous {
 protected:
  asio::awaitable<RawClient> greeted(std::uint16_t version = 2) {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello = message(rv::Hello{version, corma::BackendId::none, {}});
    EXPECT_TRUE(co_await client.ask(std::move(hello)));
    co_return client;
  }

  /// Whether the owner closes `client`'s connection (its next read ends).
  static asio::awaitable<bool> closed(RawClient& client) {
    auto next = co_await client.connection->read(std::chrono::seconds(5));
    co_return !next && next.error().is(errc::peer_unreachable);
  }

  static asio::awaitable<bool> still_served(RawClient& client) {
    auto acquire = message(rv::Acquire{"small", false});
    auto answer = co_await client.ask(std::move(acquire));
    co_return answer && std::holds_alternative<rv::Chunked>(answer.value());
  }

  static std::uint64_t lease_of(const corma::Result<rv::Message>& answer) {
    auto* chunked = answer ? std::get_if<rv::Chunked>(&answer.value()) : nullptr;
    return chunked == nullptr ? 0 : chunked->lease;
  }
};

TEST_F(ProtocolEdges, BatchCountsOfZeroOrBeyondTheNamesPresentAreMalformedAndEndTheConnection) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    for (const auto& payload : {batch_payload(0, {}), batch_payload(3, {"small", "big"})}) {
      auto client = co_await greeted();
      const auto bytes = raw_frame(rv::MessageType::acquire_many, 2, payload);
      co_await asio::async_write(client.connection->socket(), asio::buffer(bytes), asio::use_awaitable);
      EXPECT_TRUE(co_await closed(client)) << "a malformed batch was answered";
    }
    auto named = co_await greeted();
    const auto empty_name = raw_frame(rv::MessageType::acquire, 2, {std::byte{0}, std::byte{0}, std::byte{0}});
    co_await asio::async_write(named.connection->socket(), asio::buffer(empty_name), asio::use_awaitable);
    EXPECT_TRUE(co_await closed(named)) << "an empty name was answered";
  }());
}

TEST_F(ProtocolEdges, APushLandingDescriptorOfNoBytesOrPastAnyKeyIsAnsweredProtocolAndTheConnectionKept) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await greeted(3);
    for (const std::size_t landing_size : {std::size_t{0}, std::size_t{5000}}) {
      // name "small", notify 0, tag 0, then the landing: its length and that many bytes.
      std::vector<std::byte> payload{std::byte{5}, std::byte{0}};
      for (char c : std::string("small")) payload.push_back(static_cast<std::byte>(c));
      payload.insert(payload.end(), 1 + 8, std::byte{0});
      for (int i = 0; i < 4; ++i) payload.push_back(static_cast<std::byte>((landing_size >> (8 * i)) & 0xffU));
      payload.insert(payload.end(), landing_size, std::byte{0x5a});
      const auto bytes = raw_frame(rv::MessageType::push, 7, payload);
      co_await asio::async_write(client.connection->socket(), asio::buffer(bytes), asio::use_awaitable);
      auto answer = co_await client.connection->read(std::chrono::seconds(5));
      EXPECT_TRUE(answer) << "landing of " << landing_size << " bytes: " << answer.error().message();
      if (!answer) co_return;
      auto* error = std::get_if<rv::ErrorReply>(&answer.value().message);
      EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::protocol))
          << "landing of " << landing_size << " bytes was not answered protocol";
      EXPECT_TRUE(co_await still_served(client));
    }
  }());
}

TEST_F(ProtocolEdges, AnUnpublishedNameIsNotFoundAndALeaseOnItSaysChangedEvenWhenTheNameComesBack) {
  start_owner();
  const auto other = pattern(700, 9);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await greeted();
    auto acquire = message(rv::Acquire{"small", false});
    const auto lease = lease_of(co_await client.ask(std::move(acquire)));
    EXPECT_NE(lease, 0u);
    EXPECT_TRUE(owner->unpublish("small"));
    EXPECT_FALSE(owner->unpublish("small")) << "a name unpublished twice";
    auto again = message(rv::Acquire{"small", false});
    auto answer = co_await client.ask(std::move(again));
    EXPECT_TRUE(answer && std::holds_alternative<rv::NotFound>(answer.value())) << "an unpublished name was lent";
    // Published again: the old lease read the first publication, not this one.
    owner->publish("small", corma::PublishedObject{other, nullptr});
    auto release = message(rv::Release{lease});
    auto released = co_await client.ask(std::move(release));
    auto* error = released ? std::get_if<rv::ErrorReply>(&released.value()) : nullptr;
    EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::object_changed))
        << "a lease on an unpublished object was released as unchanged";
    auto fresh = message(rv::Acquire{"small", false});
    auto lent = co_await client.ask(std::move(fresh));
    auto* chunked = lent ? std::get_if<rv::Chunked>(&lent.value()) : nullptr;
    EXPECT_TRUE(chunked != nullptr && chunked->size == other.size());
  }());
  EXPECT_FALSE(owner->unpublish("never published"));
}

TEST_F(ProtocolEdges, TheSameLeaseTwiceInOneReleaseManyIsReleasedThenNamedNotHeld) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await greeted();
    auto acquire = message(rv::Acquire{"small", false});
    const auto lease = lease_of(co_await client.ask(std::move(acquire)));
    EXPECT_NE(lease, 0u);
    auto twice = message(rv::ReleaseMany{{lease, lease}});
    auto answer = co_await client.ask(std::move(twice));
    auto* released = answer ? std::get_if<rv::ReleasedMany>(&answer.value()) : nullptr;
    EXPECT_TRUE(released != nullptr &&
                released->codes == (std::vector<std::uint16_t>{0, static_cast<std::uint16_t>(errc::region_not_found)}));
    EXPECT_TRUE(co_await still_served(client));
  }());
}

TEST_F(ProtocolEdges, ALapsedLeaseIsNamedNotHeldByReleaseReleaseManyAndNextWindow) {
  corma::OwnerConfig config;
  config.lease_timeout = std::chrono::milliseconds(50);
  config.reap_interval = std::chrono::milliseconds(10);
  start_owner(64 << 20, config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await greeted();
    auto acquire = message(rv::Acquire{"small", false});
    const auto lease = lease_of(co_await client.ask(std::move(acquire)));
    (void)co_await until([&] { return owner->stats().live_leases == 0; }, std::chrono::seconds(5));
    EXPECT_EQ(owner->stats().leases_expired, 1u);
    auto single = message(rv::Release{lease});
    auto released = co_await client.ask(std::move(single));
    EXPECT_TRUE(is_error(released, errc::region_not_found)) << "a lapsed lease was released as if it held";
    auto many = message(rv::ReleaseMany{{lease}});
    auto answer = co_await client.ask(std::move(many));
    auto* codes = answer ? std::get_if<rv::ReleasedMany>(&answer.value()) : nullptr;
    EXPECT_TRUE(codes != nullptr &&
                codes->codes == (std::vector<std::uint16_t>{static_cast<std::uint16_t>(errc::region_not_found)}));
    auto window = message(rv::NextWindow{lease, 0});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(window)), errc::region_not_found));
    EXPECT_TRUE(co_await still_served(client));
  }());
}

TEST_F(ProtocolEdges, OwnerMessagesOfVersionTwoSentOnAVersionOneSessionEndTheConnection) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    std::vector<rv::Message> owner_messages = {rv::Granted{{rv::NotFound{}}}, rv::ReleasedMany{{0}},
                                               rv::RdmaWindow{1, 10, 100, 0, 10, std::vector<std::byte>(40)}};
    for (auto& sent : owner_messages) {
      auto client = co_await greeted(1);
      auto answer = co_await client.ask(std::move(sent));
      EXPECT_TRUE(is_error(answer, errc::protocol));
      EXPECT_TRUE(co_await closed(client)) << "the connection was kept";
    }
  }());
}

}  // namespace
