// One set of rules for every way to fetch: async_fetch, async_fetch_into,
// async_fetch_to, a set of one through async_fetch_many, and
// async_push_fetch are each held to the same answers. A name nobody
// published is not found; a name no owner could take is refused before
// anything is sent; an object published again while it is read fails with
// object_changed, never with the old or new bytes as a success; a fetch
// cancelled while its transfer runs answers `cancelled` once the transfer
// ended, and leaves no lease behind; and after any of these the connection
// serves the next fetch whole.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <optional>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;
using corma::Result;

using Bytes = std::vector<std::byte>;

class FetchRules;

/// One entry point: fetches `name` and hands back its bytes, or the error
/// the entry point answered for that object.
struct EntryPoint {
  const char* name;
  asio::awaitable<Result<Bytes>> (*fetch)(FetchRules& test, corma::Consumer& consumer, std::string name);
};

class FetchRules : public Rendezvous, public ::testing::WithParamInterface<EntryPoint> {
 public:
  /// Registered memory the entry points that need it land in.
  Bytes memory = Bytes(2 << 20);
  corma::RegionGuard region;

  void SetUp() override {
    corma::OwnerConfig config;
    config.accept_push = true;
    start_owner(64 << 20, config);
    region = corma::testing::run(io, consumer_registry->async_register(memory, corma::Access::remote_read_write,
                                                                       asio::use_awaitable))
                 .value();
  }

  /// The first `size` bytes of the registered memory.
  Bytes landed(std::uint64_t size) const {
    return Bytes(memory.begin(), memory.begin() + static_cast<std::ptrdiff_t>(size));
  }

  Result<Bytes> fetch(corma::Consumer& consumer, const std::string& name) {
    return corma::testing::run(io, GetParam().fetch(*this, consumer, name));
  }

  std::unique_ptr<corma::Consumer> consumer() { return corma::testing::run(io, connect(consumer_registry)).value(); }

  /// Runs `name`'s fetch with every transfer held until `while_held` ran.
  Result<Bytes> fetch_while_held(corma::Consumer& consumer, const std::string& name,
                                 const std::function<void(asio::cancellation_signal&)>& while_held) {
    consumer_backend->hold_transfers();
    owner_backend->hold_transfers();
    asio::cancellation_signal cancel;
    std::optional<Result<Bytes>> outcome;
    corma::testing::run(io, [&]() -> asio::awaitable<void> {
      asio::co_spawn(
          io, [&]() -> asio::awaitable<void> { outcome = co_await GetParam().fetch(*this, consumer, name); },
          asio::bind_cancellation_slot(cancel.slot(), asio::detached));
      co_await until([&] { return consumer_backend->transfers_in_flight() + owner_backend->transfers_in_flight() > 0; },
                     std::chrono::seconds(10));
      EXPECT_GT(consumer_backend->transfers_in_flight() + owner_backend->transfers_in_flight(), 0U)
          << "the fetch's transfer never started";
      while_held(cancel);
      consumer_backend->release_transfers();
      owner_backend->release_transfers();
      co_await until([&] { return outcome.has_value(); }, std::chrono::seconds(10));
    }());
    if (!outcome) return corma::fail(errc::timeout, "the fetch never answered");
    return std::move(*outcome);
  }
};

asio::awaitable<Result<Bytes>> whole(FetchRules&, corma::Consumer& consumer, std::string name) {
  auto fetched = co_await consumer.async_fetch(std::move(name));
  if (!fetched) co_return std::move(fetched).error();
  const auto bytes = fetched.value().data.bytes();
  co_return Bytes(bytes.begin(), bytes.end());
}

asio::awaitable<Result<Bytes>> into_region(FetchRules& test, corma::Consumer& consumer, std::string name) {
  auto fetched = co_await consumer.async_fetch_into(std::move(name), test.region);
  if (!fetched) co_return std::move(fetched).error();
  co_return test.landed(fetched.value().size);
}

asio::awaitable<Result<Bytes>> to_sink(FetchRules&, corma::Consumer& consumer, std::string name) {
  CollectingSink collected;
  auto fetched = co_await consumer.async_fetch_to(std::move(name), corma::StreamDestination{collected.sink(), {}});
  if (!fetched) co_return std::move(fetched).error();
  co_return std::move(collected.bytes);
}

asio::awaitable<Result<Bytes>> set_of_one(FetchRules& test, corma::Consumer& consumer, std::string name) {
  // Named before the co_await: g++ 12 mishandles braced temporaries inside one.
  std::vector<std::string> names;
  names.push_back(std::move(name));
  std::vector<corma::FetchSlot> slots;
  slots.push_back(corma::FetchSlot{&test.region, 0, test.memory.size()});
  auto fetched = co_await consumer.async_fetch_many(std::move(names), std::move(slots));
  if (!fetched) co_return std::move(fetched).error();
  auto& outcome = fetched.value().front();
  if (!outcome) co_return std::move(outcome).error();
  co_return test.landed(outcome.value().size);
}

asio::awaitable<Result<Bytes>> pushed(FetchRules& test, corma::Consumer& consumer, std::string name) {
  auto fetched = co_await consumer.async_push_fetch(std::move(name), test.region);
  if (!fetched) co_return std::move(fetched).error();
  EXPECT_TRUE(fetched.value().pushed) << "the owner read instead of pushing: " << fetched.value().push_refusal;
  co_return test.landed(fetched.value().size);
}

TEST_P(FetchRules, AnUnpublishedNameIsNotFoundAndTheConnectionServesOn) {
  auto c = consumer();
  auto missing = fetch(*c, "nobody published this");
  ASSERT_FALSE(missing);
  EXPECT_TRUE(missing.error().is(errc::region_not_found)) << missing.error().message();
  auto next = fetch(*c, "big");
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(next.value(), big);
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_P(FetchRules, ANameWithAControlByteIsRefusedBeforeTheOwnerHearsOfIt) {
  auto c = consumer();
  const auto refused_before = owner->stats().refused_requests;
  auto refused = fetch(*c, std::string("bad\x01name"));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::not_owned)) << refused.error().message();
  EXPECT_EQ(owner->stats().refused_requests, refused_before) << "the owner was asked";
  auto next = fetch(*c, "small");
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(next.value(), small);
}

TEST_P(FetchRules, AnObjectPublishedAgainWhileItIsReadFailsWithObjectChanged) {
  auto c = consumer();
  const auto replacement = pattern(big.size(), 77);
  auto changed = fetch_while_held(*c, "big", [&](asio::cancellation_signal&) {
    owner->publish("big", corma::PublishedObject{replacement, nullptr});
  });
  ASSERT_FALSE(changed) << "a read that spanned a publication succeeded";
  EXPECT_TRUE(changed.error().is(errc::object_changed)) << changed.error().message();
  EXPECT_EQ(owner->stats().live_leases, 0U);
  auto next = fetch(*c, "big");
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(next.value(), replacement);
}

TEST_P(FetchRules, CancelledWhileItsTransferRunsAnswersCancelledOnceItEndedAndLeavesNoLease) {
  auto c = consumer();
  auto cancelled = fetch_while_held(*c, "big", [](asio::cancellation_signal& cancel) {
    cancel.emit(asio::cancellation_type::terminal);
  });
  ASSERT_FALSE(cancelled) << "a cancelled fetch succeeded";
  EXPECT_TRUE(cancelled.error().is(errc::cancelled)) << cancelled.error().message();
  EXPECT_EQ(consumer_backend->transfers_in_flight() + owner_backend->transfers_in_flight(), 0U)
      << "answered before its transfer ended";
  corma::testing::run(io, until([&] { return owner->stats().live_leases == 0; }, std::chrono::seconds(10)));
  EXPECT_EQ(owner->stats().live_leases, 0U);
  auto next = fetch(*c, "big");
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(next.value(), big);
}

INSTANTIATE_TEST_SUITE_P(EveryEntryPoint, FetchRules,
                         ::testing::Values(EntryPoint{"fetch", whole}, EntryPoint{"fetch_into", into_region},
                                           EntryPoint{"fetch_to", to_sink}, EntryPoint{"fetch_many", set_of_one},
                                           EntryPoint{"push_fetch", pushed}),
                         [](const auto& entry) { return std::string(entry.param.name); });

}  // namespace
