// Push fetches (Consumer::async_push_fetch, protocol version 3): the owner
// writes the object into the landing the consumer offered, only there and
// only the object's bytes, answers once they are in place, and notifies when
// asked; an owner that takes no pushes is read from instead, exactly once.
// A raw client plays the hostile consumer: pushes out of order, on an old
// protocol version, with landings for another backend or too small.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <optional>

#include <corma/descriptor.hpp>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;
using corma::Path;

constexpr auto sentinel = std::byte{0xEE};

class Push : public Rendezvous {
 protected:
  corma::OwnerConfig pushing() {
    corma::OwnerConfig config;
    config.accept_push = true;
    return config;
  }

  /// Landing memory of `size` bytes full of the sentinel, registered on the
  /// consumer's side with `access`.
  corma::RegionGuard landing_of(std::vector<std::byte>& memory, std::size_t size,
                                corma::Access access = corma::Access::remote_read_write) {
    memory.assign(size, sentinel);
    return corma::testing::run(io, consumer_registry->async_register(memory, access, asio::use_awaitable)).value();
  }

  static bool untouched(std::span<const std::byte> bytes) {
    return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == sentinel; });
  }

  corma::Result<corma::FetchOutcome> push_fetch(const std::string& name, corma::RegionGuard& landing,
                                                corma::PushOptions options = {}) {
    return corma::testing::run(io, [&]() -> asio::awaitable<corma::Result<corma::FetchOutcome>> {
      auto consumer = (co_await connect(consumer_registry)).value();
      co_return co_await consumer->async_push_fetch(name, landing, options);
    }());
  }
};

TEST_F(Push, TheOwnerWritesTheObjectExactlyWhereOfferedAndNowhereElse) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size() + 8192);
  auto outcome = push_fetch("big", landing, corma::PushOptions{.offset = 4096, .notify_tag = std::nullopt});
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_TRUE(outcome.value().pushed);
  EXPECT_EQ(outcome.value().path, Path::rdma);
  EXPECT_EQ(outcome.value().size, big.size());
  EXPECT_TRUE(std::equal(big.begin(), big.end(), memory.begin() + 4096));
  EXPECT_TRUE(untouched(std::span(memory).first(4096))) << "the owner wrote before the offered offset";
  EXPECT_TRUE(untouched(std::span(memory).subspan(4096 + big.size()))) << "the owner wrote past the object";
  EXPECT_EQ(owner->stats().pushes, 1U);
  EXPECT_EQ(owner->stats().pushed_bytes, big.size());
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(Push, ManyPushesOnOneConnectionShareOnePeerAndEachArrives) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    for (int round = 0; round < 5; ++round) {
      std::fill(memory.begin(), memory.end(), sentinel);
      auto outcome = co_await consumer->async_push_fetch(round % 2 == 0 ? "big" : "small", landing);
      EXPECT_TRUE(outcome && outcome.value().pushed);
      const auto& expected = round % 2 == 0 ? big : small;
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), memory.begin())) << "round " << round;
    }
    EXPECT_EQ(consumer->stats().pushes, 5U);
  }());
  EXPECT_EQ(owner->stats().pushes, 5U);
}

TEST_F(Push, ANotificationFindsTheBytesInPlace) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    bool in_place = false;
    std::optional<corma::Result<corma::Notification>> received;
    // Another part of the program waits for the notification, not for the fetch.
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      received = co_await consumer_backend->async_receive_notification(asio::use_awaitable);
      in_place = std::equal(big.begin(), big.end(), memory.begin());
    }, asio::detached);
    auto outcome = co_await consumer->async_push_fetch("big", landing, corma::PushOptions{.offset = 0, .notify_tag = 77});
    EXPECT_TRUE(outcome && outcome.value().pushed);
    co_await until([&] { return received.has_value(); }, std::chrono::seconds(5));
    EXPECT_TRUE(received && *received);
    if (received && *received) {
      EXPECT_EQ(received->value().tag, 77U);
    }
    EXPECT_TRUE(in_place) << "the notification came before the bytes";
  }());
}

TEST_F(Push, APushFetchCancelledWhileTheOwnerWritesAnswersCancelledOnceTheOwnerHasStopped) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  std::optional<corma::Result<corma::FetchOutcome>> outcome;
  bool answered_while_writing = true;
  asio::cancellation_signal cancel;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    // A first push sets the push peer up; the second is held in the owner's backend.
    EXPECT_TRUE(co_await consumer->async_push_fetch("small", landing));
    owner_backend->hold_transfers();
    asio::co_spawn(io, [&]() -> asio::awaitable<void> { outcome = co_await consumer->async_push_fetch("big", landing); },
                   asio::bind_cancellation_slot(cancel.slot(), asio::detached));
    co_await until([&] { return owner_backend->transfers_in_flight() > 0; }, std::chrono::seconds(5));
    cancel.emit(asio::cancellation_type::terminal);
    asio::steady_timer turn(io, std::chrono::milliseconds(50));
    co_await turn.async_wait(asio::use_awaitable);
    answered_while_writing = outcome.has_value();
    owner_backend->release_transfers();
    co_await until([&] { return outcome.has_value(); }, std::chrono::seconds(5));
  }());
  EXPECT_FALSE(answered_while_writing) << "answered while the owner could still write into the landing";
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(*outcome) << "a cancelled push fetch answered success";
  EXPECT_TRUE(outcome->error().is(errc::cancelled)) << outcome->error().message();
}

TEST_F(Push, APushFetchCancelledBeforeItAsksSendsNothing) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  std::optional<corma::Result<corma::FetchOutcome>> outcome;
  asio::cancellation_signal cancel;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    // Cancelled while its push peer is set up (the first push of the connection).
    asio::co_spawn(io, [&]() -> asio::awaitable<void> { outcome = co_await consumer->async_push_fetch("big", landing); },
                   asio::bind_cancellation_slot(cancel.slot(), asio::detached));
    cancel.emit(asio::cancellation_type::terminal);
    co_await until([&] { return outcome.has_value(); }, std::chrono::seconds(5));
  }());
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(*outcome);
  EXPECT_TRUE(outcome->error().is(errc::cancelled)) << outcome->error().message();
  EXPECT_EQ(owner->stats().pushes, 0U) << "the owner was asked to push for a cancelled fetch";
  EXPECT_TRUE(untouched(memory));
}

TEST_F(Push, AnOwnerThatTakesNoPushesIsReadFromInsteadExactlyOnce) {
  start_owner();  // accept_push is off by default
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size() + 100);
  auto outcome = push_fetch("big", landing, corma::PushOptions{.offset = 100, .notify_tag = std::nullopt});
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_FALSE(outcome.value().pushed);
  EXPECT_NE(outcome.value().push_refusal.find("takes no pushes"), std::string::npos) << outcome.value().push_refusal;
  EXPECT_EQ(outcome.value().path, Path::rdma) << "read over RDMA instead";
  EXPECT_TRUE(std::equal(big.begin(), big.end(), memory.begin() + 100));
  EXPECT_TRUE(untouched(std::span(memory).first(100)));
  EXPECT_EQ(owner->stats().pushes, 0U);
  EXPECT_EQ(owner->stats().decisions.rdma, 1U);
}

TEST_F(Push, AnOwnerWhoseBudgetCannotHoldTheObjectIsReadInChunks) {
  start_owner(4096, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  auto outcome = push_fetch("big", landing);
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_FALSE(outcome.value().pushed);
  EXPECT_NE(outcome.value().push_refusal.find("budget"), std::string::npos) << outcome.value().push_refusal;
  EXPECT_TRUE(std::equal(big.begin(), big.end(), memory.begin()));
}

TEST_F(Push, AnObjectLargerThanTheLandingIsRefusedAndNothingIsWritten) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size() - 1);
  auto outcome = push_fetch("big", landing);
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::out_of_range)) << outcome.error().message();
  EXPECT_TRUE(untouched(memory));
  EXPECT_EQ(owner->stats().pushes, 0U);
}

TEST_F(Push, AnUnknownNameIsNotFound) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, 4096);
  auto outcome = push_fetch("nothing here", landing);
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::region_not_found)) << outcome.error().message();
  EXPECT_TRUE(untouched(memory));
}

// ---- a hostile consumer ----------------------------------------------------------

/// A raw version 3 client with its push peer set up, as a consumer would.
class RawPush : public Push {
 protected:
  struct Client {
    RawClient raw;
    corma::PeerId push_peer;
  };

  asio::awaitable<RawClient> hello(std::uint16_t version) {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto request1 = message(rv::Hello{version, corma::BackendId::none, {}});
    auto greeted = co_await client.ask(std::move(request1));
    EXPECT_TRUE(greeted && std::holds_alternative<rv::HelloOk>(greeted.value()));
    co_return client;
  }

  asio::awaitable<Client> ready_client() {
    auto client = co_await hello(rv::push_protocol_version);
    auto request2 = message(rv::PushOpen{});
    auto opened = co_await client.ask(std::move(request2));
    auto* offer = opened ? std::get_if<rv::PushOffer>(&opened.value()) : nullptr;
    if (offer == nullptr) throw std::runtime_error("push_open was not answered with an offer");
    auto accepted = co_await consumer_backend->async_peer_accept(offer->peer_offer, asio::use_awaitable);
    if (!accepted) throw std::runtime_error(accepted.error().message());
    auto request3 = message(rv::PushConnect{accepted.value().blob});
    auto connected = co_await client.ask(std::move(request3));
    if (!connected || !std::holds_alternative<rv::PushReady>(connected.value())) {
      throw std::runtime_error("push_connect was not answered push_ready");
    }
    co_return Client{std::move(client), accepted.value().peer};
  }

  static std::vector<std::byte> describe_landing(const corma::RegionGuard& landing) {
    return corma::encode(landing.remote());
  }
};

TEST_F(RawPush, PushesOutOfOrderAreRefusedAndTheConnectionServesOn) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await hello(rv::push_protocol_version);
    auto request4 = message(rv::Push{"big", false, 0, describe_landing(landing)});
    auto early = co_await client.ask(std::move(request4));
    EXPECT_TRUE(is_error(early, errc::not_configured)) << "a push before its peer is set up";
    auto request5 = message(rv::PushConnect{std::vector<std::byte>(16, std::byte{1})});
    auto unasked = co_await client.ask(std::move(request5));
    EXPECT_TRUE(is_error(unasked, errc::protocol)) << "push_connect without an offer";
    auto request6 = message(rv::PushOpen{});
    auto opened = co_await client.ask(std::move(request6));
    EXPECT_TRUE(opened && std::holds_alternative<rv::PushOffer>(opened.value()));
    auto request7 = message(rv::PushOpen{});
    auto again = co_await client.ask(std::move(request7));
    EXPECT_TRUE(is_error(again, errc::protocol)) << "a second push_open";
    auto request8 = message(rv::PushConnect{std::vector<std::byte>(16, std::byte{1})});
    auto garbage = co_await client.ask(std::move(request8));
    EXPECT_TRUE(garbage && std::holds_alternative<rv::ErrorReply>(garbage.value())) << "a forged peer answer";
    auto request9 = message(rv::Acquire{"small", false});
    auto acquired = co_await client.ask(std::move(request9));
    EXPECT_TRUE(acquired && std::holds_alternative<rv::Chunked>(acquired.value())) << "the connection serves on";
  }());
  EXPECT_TRUE(untouched(memory));
  EXPECT_GE(owner->stats().refused_requests, 3U);
}

TEST_F(RawPush, APushLookUpIsGivenUpWhenTheConnectionThatAskedForItGoes) {
  // As an acquire's: a cold file nobody waits for any more is not read on,
  // and the session does not wait for the read to end.
  start_owner(64 << 20, pushing());
  HeldLookUps lookups;
  owner->set_resolver(lookups.resolver());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await ready_client();
    const rv::Frame push{client.raw.next++, rv::Message(rv::Push{"cold.bin", false, 0, describe_landing(landing)})};
    EXPECT_TRUE(co_await client.raw.connection->write(push, std::chrono::seconds(5)));
    co_await until([&] { return lookups.asked() == 1; }, std::chrono::seconds(5));
    EXPECT_EQ(lookups.asked(), 1U) << "the push's look-up never reached the resolver";
    client.raw.connection->close();
    co_await until([&] { return lookups.given_up() == 1 && owner->stats().open_connections == 0; },
                   std::chrono::seconds(5));
    (void)co_await consumer_backend->async_peer_close(client.push_peer, asio::use_awaitable);
  }());
  EXPECT_EQ(lookups.given_up(), 1U) << "the push's look-up went on after its connection went";
  EXPECT_EQ(owner->stats().open_connections, 0U) << "the session waited for a look-up nobody wanted";
  EXPECT_EQ(owner->stats().pushes, 0U);
  EXPECT_TRUE(untouched(memory));
}

TEST_F(RawPush, AnOlderProtocolVersionGetsNoPush) {
  start_owner(64 << 20, pushing());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await hello(2);
    auto request10 = message(rv::PushOpen{});
    auto refused = co_await client.ask(std::move(request10));
    EXPECT_TRUE(is_error(refused, errc::protocol));
    auto request11 = message(rv::Acquire{"small", false});
    auto acquired = co_await client.ask(std::move(request11));
    EXPECT_TRUE(acquired && std::holds_alternative<rv::Chunked>(acquired.value())) << "the connection serves on";
  }());
}

TEST_F(RawPush, LandingsTheOwnerMustNotWriteAreRefused) {
  start_owner(64 << 20, pushing());
  std::vector<std::byte> memory;
  auto landing = landing_of(memory, big.size());
  std::vector<std::byte> read_only_memory;
  auto read_only = landing_of(read_only_memory, big.size(), corma::Access::remote_read);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await ready_client();
    // Another backend's landing, before any provider sees it.
    auto foreign = landing.remote();
    foreign.backend = corma::BackendId{0x7F};
    auto request12 = message(rv::Push{"big", false, 0, corma::encode(foreign)});
    auto other = co_await client.raw.ask(std::move(request12));
    EXPECT_TRUE(is_error(other, errc::invalid_key));
    // A landing that claims less than the object.
    auto short_one = landing.remote();
    short_one.len = big.size() / 2;
    auto request13 = message(rv::Push{"big", false, 0, corma::encode(short_one)});
    auto too_small = co_await client.raw.ask(std::move(request13));
    EXPECT_TRUE(is_error(too_small, errc::out_of_range));
    // A landing registered without remote write: the put is refused.
    auto request14 = message(rv::Push{"big", false, 0, describe_landing(read_only)});
    auto refused = co_await client.raw.ask(std::move(request14));
    EXPECT_TRUE(refused && std::holds_alternative<rv::ErrorReply>(refused.value()));
    // And a good one still works on the same connection.
    auto request15 = message(rv::Push{"big", false, 0, describe_landing(landing)});
    auto pushed = co_await client.raw.ask(std::move(request15));
    auto* done = pushed ? std::get_if<rv::Pushed>(&pushed.value()) : nullptr;
    EXPECT_TRUE(done != nullptr && done->size == big.size());
    (void)co_await consumer_backend->async_peer_close(client.push_peer, asio::use_awaitable);
  }());
  EXPECT_TRUE(untouched(read_only_memory)) << "the owner wrote into memory offered read-only";
  EXPECT_TRUE(std::equal(big.begin(), big.end(), memory.begin()));
  EXPECT_EQ(owner->stats().pushes, 1U);
}

}  // namespace
