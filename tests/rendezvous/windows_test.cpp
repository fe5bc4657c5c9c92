// RDMA windows (protocol version 2): an object larger than the owner's
// budget holds is lent in registered slices, one after the other, under one
// lease; chunked only when not even the smallest window fits. And the
// owner's answers to windows asked out of order, past the end or for
// another connection's lease, from a raw client.
#include "rendezvous/rendezvous_fixture.hpp"

#include <unistd.h>

#include <cstring>
#include <map>

namespace {

using namespace corma::testing::rendezvous;
using corma::Consumer;
using corma::errc;
using corma::Fetched;
using corma::FetchOutcome;
using corma::FetchSlot;
using corma::Path;
using corma::RegionGuard;
using corma::Result;

constexpr std::uint64_t MiB = 1 << 20;

class Windows : public Rendezvous {
 protected:
  /// Ten MiB and a bit: more than the owner's 4 MiB budget holds.
  std::vector<std::byte> huge = pattern(10 * MiB + 4321, 9);

  void start_small_owner(std::uint64_t budget = 4 * MiB, std::uint64_t min_window = MiB) {
    corma::OwnerConfig config;
    config.min_window = min_window;
    start_owner(budget, config);
    owner->publish("huge", corma::PublishedObject{huge, nullptr});
  }

  std::unique_ptr<Consumer> consumer(std::uint16_t version = 2) {
    corma::ConsumerConfig config;
    config.protocol_version = version;
    auto connected = corma::testing::run(
        io, Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, config));
    if (!connected) throw std::runtime_error(connected.error().message());
    return std::move(connected).value();
  }

  Fetched fetch(Consumer& c, std::string name) {
    auto fetched = corma::testing::run(io, c.async_fetch(std::move(name)));
    if (!fetched) throw std::runtime_error(fetched.error().message());
    return std::move(fetched).value();
  }

  static bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
  }
};

TEST_F(Windows, AnObjectLargerThanTheBudgetIsReadOverRdmaWindowByWindow) {
  start_small_owner();
  auto c = consumer();
  auto fetched = fetch(*c, "huge");
  EXPECT_EQ(fetched.path, Path::rdma);
  EXPECT_FALSE(fetched.fell_back()) << fetched.reason_text();
  EXPECT_TRUE(same_bytes(fetched.data.bytes().first(fetched.size), huge));
  // Alone, the lease's windows are half the budget (the other half kept
  // for a newcomer), less the page the registration rounds to: the object
  // (a vector) does not start on a page.
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t window = 2 * MiB - page;
  EXPECT_EQ(owner->stats().windows, (huge.size() + window - 1) / window);
  EXPECT_EQ(owner->stats().live_leases, 0U);
  EXPECT_LE(owner_registry->stats().registered_bytes, 4 * MiB);
}

TEST_F(Windows, WindowsLandInARegisteredDestinationAndReachASinkInOrder) {
  start_small_owner();
  auto c = consumer();
  std::vector<std::byte> landing(16 * MiB);
  auto destination =
      corma::testing::run(io, consumer_registry->async_register(landing, corma::Access::local, asio::use_awaitable))
          .value();
  auto into = corma::testing::run(io, c->async_fetch_into("huge", destination));
  ASSERT_TRUE(into) << into.error().message();
  EXPECT_EQ(into.value().path, Path::rdma);
  EXPECT_TRUE(same_bytes(std::span(landing).first(huge.size()), huge));

  std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces;
  std::vector<std::byte> streamed(huge.size());
  corma::ChunkSink sink = [&](std::uint64_t offset, std::span<const std::byte> bytes) -> Result<void> {
    pieces.emplace_back(offset, bytes.size());
    std::memcpy(streamed.data() + offset, bytes.data(), bytes.size());
    return corma::success();
  };
  auto to = corma::testing::run(io, c->async_fetch_to("huge", sink));
  ASSERT_TRUE(to) << to.error().message();
  EXPECT_EQ(to.value().path, Path::rdma);
  EXPECT_TRUE(same_bytes(streamed, huge));
  ASSERT_GE(pieces.size(), 2U) << "one piece per window";
  std::uint64_t expected = 0;
  for (const auto& [offset, len] : pieces) {
    EXPECT_EQ(offset, expected);
    expected += len;
  }
  EXPECT_EQ(expected, huge.size());
}

TEST_F(Windows, ChunkedOnlyWhenNotEvenTheSmallestWindowFits) {
  start_small_owner(512 * 1024, MiB);
  auto c = consumer();
  auto fetched = fetch(*c, "huge");
  EXPECT_EQ(fetched.path, Path::chunked);
  EXPECT_EQ(fetched.reason, corma::ChunkedReason::no_window);
  EXPECT_TRUE(same_bytes(fetched.data.bytes().first(fetched.size), huge));
  EXPECT_EQ(owner->stats().windows, 0U);
}

TEST_F(Windows, AVersionOneConsumerIsServedInChunksAsBefore) {
  start_small_owner();
  auto c = consumer(1);
  auto fetched = fetch(*c, "huge");
  EXPECT_EQ(fetched.path, Path::chunked);
  EXPECT_EQ(fetched.reason, corma::ChunkedReason::budget);
  EXPECT_TRUE(same_bytes(fetched.data.bytes().first(fetched.size), huge));
}

TEST_F(Windows, AFailedWindowFallsBackToChunksExactlyOnce) {
  start_small_owner();
  consumer_backend->set_faults(corma::testing::TestBackendFaults{.fail_transfers = true});
  auto c = consumer();
  auto fetched = fetch(*c, "huge");
  EXPECT_EQ(fetched.path, Path::chunked);
  EXPECT_TRUE(fetched.fell_back());
  EXPECT_TRUE(same_bytes(fetched.data.bytes().first(fetched.size), huge));
  EXPECT_EQ(c->stats().fallbacks, 1U);
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(Windows, ConsumersReadingWindowsAtOnceShareTheBudget) {
  start_small_owner(8 * MiB);
  auto a = consumer();
  auto b = consumer();
  std::optional<Result<Fetched>> from_a;
  std::optional<Result<Fetched>> from_b;
  a->async_fetch("huge", [&](Result<Fetched> r) { from_a.emplace(std::move(r)); });
  b->async_fetch("huge", [&](Result<Fetched> r) { from_b.emplace(std::move(r)); });
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(from_a && from_b) && std::chrono::steady_clock::now() < limit) {
    io.run_one_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(from_a && from_b);
  for (auto* fetched : {&*from_a, &*from_b}) {
    ASSERT_TRUE(*fetched) << fetched->error().message();
    EXPECT_EQ(fetched->value().path, Path::rdma);
    EXPECT_TRUE(same_bytes(fetched->value().data.bytes().first(fetched->value().size), huge));
  }
  // The second lease's windows were sized by what the first left.
  EXPECT_GE(owner->stats().windows, 4U);
  EXPECT_LE(owner_registry->stats().registered_bytes, 8 * MiB);
}

TEST_F(Windows, FetchManyReadsAWindowedObjectAmongOthers) {
  start_small_owner();
  auto c = consumer();
  std::vector<std::byte> landing(12 * MiB + MiB);
  auto destination =
      corma::testing::run(io, consumer_registry->async_register(landing, corma::Access::local, asio::use_awaitable))
          .value();
  auto fetched = corma::testing::run(
      io, c->async_fetch_many({"big", "huge", "small"}, {FetchSlot{&destination, 0, MiB},
                                                          FetchSlot{&destination, MiB, 11 * MiB},
                                                          FetchSlot{&destination, 12 * MiB, MiB}}));
  ASSERT_TRUE(fetched) << fetched.error().message();
  const auto& outcomes = fetched.value();
  ASSERT_TRUE(outcomes[0] && outcomes[1] && outcomes[2]);
  EXPECT_EQ(outcomes[1].value().path, Path::rdma);
  EXPECT_TRUE(same_bytes(std::span(landing).first(big.size()), big));
  EXPECT_TRUE(same_bytes(std::span(landing).subspan(MiB, huge.size()), huge));
  EXPECT_TRUE(same_bytes(std::span(landing).subspan(12 * MiB, small.size()), small));
  EXPECT_GE(owner->stats().windows, 2U);
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

// ---- hostile window requests from a raw client --------------------------------

TEST_F(Windows, WindowsAskedOutOfOrderPastTheEndOrForeignAreRefusedAndTheLeaseKept) {
  start_small_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [client, peer] = co_await rdma_raw_client();
    auto acquire = message(rv::Acquire{"huge", true});
    auto acquired = co_await client.ask(std::move(acquire));
    auto* window = acquired ? std::get_if<rv::RdmaWindow>(&acquired.value()) : nullptr;
    EXPECT_TRUE(window != nullptr) << "the first window";
    if (window == nullptr) co_return;
    const auto lease = window->lease;
    const auto end = window->offset + window->window_len;

    auto backwards = message(rv::NextWindow{lease, 0});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(backwards)), errc::out_of_range));
    auto past_the_end = message(rv::NextWindow{lease, huge.size()});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(past_the_end)), errc::out_of_range));
    auto unknown = message(rv::NextWindow{lease + 1000, end});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(unknown)), errc::region_not_found));

    // Another connection cannot move this lease's window.
    auto other = co_await RawClient::connect(acceptor.local_endpoint());
    auto other_hello = message(rv::Hello{});
    (void)co_await other.ask(std::move(other_hello));
    auto foreign = message(rv::NextWindow{lease, end});
    EXPECT_TRUE(is_error(co_await other.ask(std::move(foreign)), errc::region_not_found));
    // A lease lent whole is not moved either.
    auto small_acquire = message(rv::Acquire{"small", false});
    auto chunked = co_await other.ask(std::move(small_acquire));
    const auto small_lease = std::get<rv::Chunked>(chunked.value()).lease;
    auto not_windowed = message(rv::NextWindow{small_lease, 0});
    EXPECT_TRUE(is_error(co_await other.ask(std::move(not_windowed)), errc::out_of_range));

    // The lease is intact: its next window may start where the first ended
    // or further on (a consumer reading a byte range skips ahead), and never
    // goes back.
    auto skipping = message(rv::NextWindow{lease, end + MiB});
    auto moved = co_await client.ask(std::move(skipping));
    auto* second = moved ? std::get_if<rv::RdmaWindow>(&moved.value()) : nullptr;
    EXPECT_TRUE(second != nullptr && second->offset == end + MiB && second->lease == lease);
    EXPECT_LE(owner_registry->stats().registered_bytes, 4 * MiB) << "the first window was let go";
    auto back_to_where_the_first_ended = message(rv::NextWindow{lease, end});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(back_to_where_the_first_ended)), errc::out_of_range));
    (void)co_await consumer_backend->async_peer_close(peer, asio::use_awaitable);
  }());
}

TEST_F(Windows, ARangeSkipsTheWindowsBeforeItAndAnOlderOwnerStepsThroughThem) {
  start_small_owner();
  const corma::ByteRange range{7 * MiB + 5, 2 * MiB};
  const auto expected = std::span<const std::byte>(huge).subspan(range.offset, *range.length);
  std::map<std::uint16_t, std::uint64_t> windows_registered;
  for (std::uint16_t version : {5, 4}) {
    SCOPED_TRACE("protocol version " + std::to_string(version));
    auto c = consumer(version);
    const auto before = owner->stats().windows;
    auto fetched = corma::testing::run(io, c->async_fetch("huge", range));
    ASSERT_TRUE(fetched) << fetched.error().message();
    EXPECT_EQ(fetched.value().path, Path::rdma) << fetched.value().reason_text();
    EXPECT_EQ(fetched.value().size, huge.size());
    EXPECT_TRUE(same_bytes(fetched.value().data.bytes().first(*range.length), expected));
    windows_registered[version] = owner->stats().windows - before;
    EXPECT_EQ(owner->stats().live_leases, 0U);
  }
  // Version 5: the first window (lent with the lease), then the two or so
  // the range spans. Version 4: every window up to the range's end.
  EXPECT_LE(windows_registered[5], 4U);
  EXPECT_GE(windows_registered[4], 5U);
}

TEST_F(Rendezvous, AVersionOneSessionCannotAskForWindows) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello = message(rv::Hello{1, {}, {}});
    (void)co_await client.ask(std::move(hello));
    auto window = message(rv::NextWindow{1, 0});
    EXPECT_TRUE(is_error(co_await client.ask(std::move(window)), errc::protocol));
  }());
}

}  // namespace
