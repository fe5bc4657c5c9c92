// One set of rules for every way to fetch: async_fetch, async_fetch_into,
// async_fetch_to (into a sink, and into an asynchronous sink on a thread of
// its own), a set of one through async_fetch_many, and
// async_push_fetch are each held to the same answers. A name nobody
// published is not found; a name no owner could take is refused before
// anything is sent; an object published again while it is read fails with
// object_changed, never with the old or new bytes as a success; a fetch
// cancelled while its transfer runs answers `cancelled` once the transfer
// ended, and leaves no lease behind; after any of these the connection
// serves the next fetch whole; and every fetch says which version it read.
// Every entry point but the push (which writes whole objects) reads byte
// ranges by the same rules too.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/thread_pool.hpp>

#include <mutex>

#include <optional>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;
using corma::Result;

using Bytes = std::vector<std::byte>;

class FetchRules;

/// What an entry point fetched: the bytes and how it went.
struct Fetch {
  Bytes bytes;
  corma::FetchOutcome outcome;
};

/// One entry point: fetches `range` of `name` and hands back its bytes, or
/// the error the entry point answered for that object.
struct EntryPoint {
  const char* name;
  asio::awaitable<Result<Fetch>> (*fetch)(FetchRules& test, corma::Consumer& consumer, std::string name,
                                          corma::ByteRange range);
};

class FetchRules : public Rendezvous, public ::testing::WithParamInterface<EntryPoint> {
 public:
  /// Registered memory the entry points that need it land in.
  Bytes memory = Bytes(2 << 20);
  corma::RegionGuard region;
  /// The thread an asynchronous sink writes on.
  asio::thread_pool writer{1};

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
    auto fetched = fetch_with_outcome(consumer, name);
    if (!fetched) return std::move(fetched).error();
    return std::move(fetched.value().bytes);
  }
  Result<Fetch> fetch_with_outcome(corma::Consumer& consumer, const std::string& name, corma::ByteRange range = {}) {
    return corma::testing::run(io, GetParam().fetch(*this, consumer, name, range));
  }

  std::unique_ptr<corma::Consumer> consumer() { return corma::testing::run(io, connect(consumer_registry)).value(); }

  /// Runs `name`'s fetch with every transfer held until `while_held` ran.
  Result<Bytes> fetch_while_held(corma::Consumer& consumer, const std::string& name,
                                 const std::function<void(asio::cancellation_signal&)>& while_held) {
    consumer_backend->hold_transfers();
    owner_backend->hold_transfers();
    asio::cancellation_signal cancel;
    std::optional<Result<Fetch>> outcome;
    corma::testing::run(io, [&]() -> asio::awaitable<void> {
      asio::co_spawn(
          io, [&]() -> asio::awaitable<void> { outcome = co_await GetParam().fetch(*this, consumer, name, {}); },
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
    if (!*outcome) return std::move(*outcome).error();
    return std::move(outcome->value().bytes);
  }
};

asio::awaitable<Result<Fetch>> whole(FetchRules&, corma::Consumer& consumer, std::string name,
                                     corma::ByteRange range) {
  auto fetched = co_await consumer.async_fetch(std::move(name), range);
  if (!fetched) co_return std::move(fetched).error();
  const auto bytes = fetched.value().data.bytes();
  co_return Fetch{Bytes(bytes.begin(), bytes.end()), fetched.value()};
}

asio::awaitable<Result<Fetch>> into_region(FetchRules& test, corma::Consumer& consumer, std::string name,
                                           corma::ByteRange range) {
  auto fetched = co_await consumer.async_fetch_into(std::move(name), test.region, range);
  if (!fetched) co_return std::move(fetched).error();
  co_return Fetch{test.landed(fetched.value().length), fetched.value()};
}

asio::awaitable<Result<Fetch>> to_sink(FetchRules&, corma::Consumer& consumer, std::string name,
                                       corma::ByteRange range) {
  // The sink is handed the range's bytes in order, at their offsets in the object.
  Bytes bytes;
  std::uint64_t next = range.offset;
  bool in_place = true;
  corma::ChunkSink sink = [&](std::uint64_t offset, std::span<const std::byte> chunk) -> Result<void> {
    in_place = in_place && offset == next;
    next = offset + chunk.size();
    bytes.insert(bytes.end(), chunk.begin(), chunk.end());
    return corma::success();
  };
  // Named before the co_await: g++ 12 destroys braced temporaries inside one twice.
  corma::StreamDestination destination{sink, {}};
  auto fetched = co_await consumer.async_fetch_to(std::move(name), std::move(destination), range);
  if (!fetched) co_return std::move(fetched).error();
  EXPECT_TRUE(in_place) << "the sink was handed bytes out of order, or at offsets other than the object's";
  co_return Fetch{std::move(bytes), fetched.value()};
}

asio::awaitable<Result<Fetch>> to_async_sink(FetchRules& test, corma::Consumer& consumer, std::string name,
                                             corma::ByteRange range) {
  // Written on a thread of its own: handed over in order, at the object's offsets.
  struct Written {
    std::mutex mutex;
    Bytes bytes;
    std::uint64_t next = 0;
    bool in_place = true;
  };
  auto written = std::make_shared<Written>();
  written->next = range.offset;
  corma::StreamDestination destination;
  destination.async_sink = corma::sink_on(
      test.writer.get_executor(), [written](std::uint64_t offset, std::span<const std::byte> chunk) -> Result<void> {
        std::lock_guard lock(written->mutex);
        written->in_place = written->in_place && offset == written->next;
        written->next = offset + chunk.size();
        written->bytes.insert(written->bytes.end(), chunk.begin(), chunk.end());
        return corma::success();
      });
  auto fetched = co_await consumer.async_fetch_to(std::move(name), std::move(destination), range);
  if (!fetched) co_return std::move(fetched).error();
  std::lock_guard lock(written->mutex);
  EXPECT_TRUE(written->in_place) << "the sink was handed bytes out of order, or at offsets other than the object's";
  co_return Fetch{std::move(written->bytes), fetched.value()};
}

asio::awaitable<Result<Fetch>> set_of_one(FetchRules& test, corma::Consumer& consumer, std::string name,
                                          corma::ByteRange range) {
  // Named before the co_await: g++ 12 mishandles braced temporaries inside one.
  std::vector<std::string> names;
  names.push_back(std::move(name));
  std::vector<corma::FetchSlot> slots;
  slots.push_back(corma::FetchSlot{&test.region, 0, test.memory.size(), range});
  auto fetched = co_await consumer.async_fetch_many(std::move(names), std::move(slots));
  if (!fetched) co_return std::move(fetched).error();
  auto& outcome = fetched.value().front();
  if (!outcome) co_return std::move(outcome).error();
  co_return Fetch{test.landed(outcome.value().length), outcome.value()};
}

asio::awaitable<Result<Fetch>> pushed(FetchRules& test, corma::Consumer& consumer, std::string name,
                                      corma::ByteRange) {
  auto fetched = co_await consumer.async_push_fetch(std::move(name), test.region);
  if (!fetched) co_return std::move(fetched).error();
  EXPECT_TRUE(fetched.value().pushed) << "the owner read instead of pushing: " << fetched.value().push_refusal;
  co_return Fetch{test.landed(fetched.value().length), fetched.value()};
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

TEST_P(FetchRules, EveryFetchSaysWhichVersionItReadTheSameUntilTheNameIsPublishedAgain) {
  auto c = consumer();
  for (const char* name : {"big", "small"}) {
    SCOPED_TRACE(name);
    auto first = fetch_with_outcome(*c, name);
    ASSERT_TRUE(first) << first.error().message();
    ASSERT_TRUE(first.value().outcome.generation.has_value()) << "a version 5 owner named no generation";
    auto again = fetch_with_outcome(*c, name);
    ASSERT_TRUE(again) << again.error().message();
    EXPECT_EQ(again.value().outcome.generation, first.value().outcome.generation);
  }
  auto before = fetch_with_outcome(*c, "big");
  ASSERT_TRUE(before) << before.error().message();
  const auto replacement = pattern(big.size(), 91);
  owner->publish("big", corma::PublishedObject{replacement, nullptr});
  auto after = fetch_with_outcome(*c, "big");
  ASSERT_TRUE(after) << after.error().message();
  EXPECT_EQ(after.value().bytes, replacement);
  ASSERT_TRUE(after.value().outcome.generation.has_value());
  EXPECT_NE(after.value().outcome.generation, before.value().outcome.generation)
      << "a new publication read as the old version";
}

/// The entry points that read byte ranges: every one but the push.
class FetchRanges : public FetchRules {};

TEST_P(FetchRanges, ARangeOfTheObjectIsExactlyItsBytesOverEveryPath) {
  auto c = consumer();
  struct Case {
    const char* object;
    corma::ByteRange range;
  };
  // "big" is lent over RDMA, "small" in chunks; ranges that start and end
  // inside a pull, cross pull boundaries, run to the end, or hold nothing.
  const Case cases[] = {{"big", {12345, 300000}}, {"big", {700001, std::nullopt}}, {"big", {0, 1}},
                        {"big", {big.size(), std::nullopt}}, {"small", {10, 500}}, {"small", {999, 1}},
                        {"small", {0, 0}}};
  for (const auto& [object, range] : cases) {
    SCOPED_TRACE(std::string(object) + " from " + std::to_string(range.offset));
    const auto& whole_object = std::string(object) == "big" ? big : small;
    const auto length = range.length.value_or(whole_object.size() - range.offset);
    auto fetched = fetch_with_outcome(*c, object, range);
    ASSERT_TRUE(fetched) << fetched.error().message();
    EXPECT_EQ(fetched.value().outcome.size, whole_object.size());
    EXPECT_EQ(fetched.value().outcome.offset, range.offset);
    EXPECT_EQ(fetched.value().outcome.length, length);
    const auto from = whole_object.begin() + static_cast<std::ptrdiff_t>(range.offset);
    EXPECT_TRUE(fetched.value().bytes == Bytes(from, from + static_cast<std::ptrdiff_t>(length)))
        << "the range's bytes differ";
  }
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_P(FetchRanges, ARangeOutsideTheObjectIsOutOfRangeItsLeaseReleasedAndTheConnectionServesOn) {
  auto c = consumer();
  const corma::ByteRange outside[] = {{big.size() + 1, std::nullopt}, {big.size() - 10, 11}, {1, big.size()}};
  for (const auto& range : outside) {
    auto refused = fetch_with_outcome(*c, "big", range);
    ASSERT_FALSE(refused) << "a range past the object's end was fetched";
    EXPECT_TRUE(refused.error().is(errc::out_of_range)) << refused.error().message();
  }
  EXPECT_EQ(owner->stats().live_leases, 0U);
  auto next = fetch(*c, "big");
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(next.value(), big);
}

INSTANTIATE_TEST_SUITE_P(EveryEntryPoint, FetchRules,
                         ::testing::Values(EntryPoint{"fetch", whole}, EntryPoint{"fetch_into", into_region},
                                           EntryPoint{"fetch_to", to_sink},
                                           EntryPoint{"fetch_to_async_sink", to_async_sink},
                                           EntryPoint{"fetch_many", set_of_one}, EntryPoint{"push_fetch", pushed}),
                         [](const auto& entry) { return std::string(entry.param.name); });

INSTANTIATE_TEST_SUITE_P(EveryEntryPointThatReadsRanges, FetchRanges,
                         ::testing::Values(EntryPoint{"fetch", whole}, EntryPoint{"fetch_into", into_region},
                                           EntryPoint{"fetch_to", to_sink},
                                           EntryPoint{"fetch_to_async_sink", to_async_sink},
                                           EntryPoint{"fetch_many", set_of_one}),
                         [](const auto& entry) { return std::string(entry.param.name); });

// ---- generations of what a resolver finds, and older consumers --------------------------

class Generations : public Rendezvous {
 protected:
  std::optional<std::uint64_t> generation_of_fetch(corma::Consumer& consumer, const std::string& name) {
    auto fetched = corma::testing::run(io, consumer.async_fetch(name));
    EXPECT_TRUE(fetched) << fetched.error().message();
    return fetched ? fetched.value().generation : std::nullopt;
  }
};

TEST_F(Generations, AResolvedVersionKeepsItsGenerationWhileItIsTheSameAndAChangeGetsANewOne) {
  start_owner();
  // A resolver that keeps its current version alive (as corma serve keeps a
  // file's snapshot), and one that hands out its bytes with no keepalive.
  auto current = std::make_shared<const Bytes>(pattern(5000, 3));
  const Bytes loose = pattern(3000, 4);
  owner->set_resolver([&](std::string_view name) -> Result<corma::PublishedObject> {
    if (name == "kept") return corma::PublishedObject{*current, current};
    if (name == "loose") return corma::PublishedObject{loose, nullptr};
    return corma::fail(errc::region_not_found, "no such object");
  });
  auto c = corma::testing::run(io, connect(consumer_registry)).value();
  const auto first = generation_of_fetch(*c, "kept");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(generation_of_fetch(*c, "kept"), first) << "the same version read as another";
  current = std::make_shared<const Bytes>(pattern(5000, 5));
  const auto changed = generation_of_fetch(*c, "kept");
  ASSERT_TRUE(changed.has_value());
  EXPECT_NE(changed, first) << "a new version read as the old one";
  // Without a keepalive nothing tells two look-ups' versions apart: each
  // gets its own generation, so equal generations still mean equal bytes.
  const auto loose_first = generation_of_fetch(*c, "loose");
  const auto loose_again = generation_of_fetch(*c, "loose");
  ASSERT_TRUE(loose_first.has_value() && loose_again.has_value());
  EXPECT_NE(loose_first, loose_again);
  // A published name never takes a number a resolved version had.
  owner->publish("kept", corma::PublishedObject{big, nullptr});
  const auto published = generation_of_fetch(*c, "kept");
  EXPECT_TRUE(published.has_value() && published != first && published != changed);
}

TEST_F(Generations, AVersionLentUnderAFreshKeepaliveEachTimeKeepsItsGeneration) {
  start_owner();
  // As corma serve lends a kept snapshot: a keepalive of its own per look-up
  // (to hear when that lending ends), the version named apart.
  auto current = std::make_shared<const Bytes>(pattern(5000, 6));
  owner->set_resolver([&](std::string_view) -> Result<corma::PublishedObject> {
    std::shared_ptr<const void> lent(current.get(), [held = current](const void*) {});
    return corma::PublishedObject{*current, std::move(lent), current};
  });
  auto c = corma::testing::run(io, connect(consumer_registry)).value();
  const auto first = generation_of_fetch(*c, "lent");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(generation_of_fetch(*c, "lent"), first) << "one version lent twice read as two";
  current = std::make_shared<const Bytes>(pattern(5000, 7));
  EXPECT_NE(generation_of_fetch(*c, "lent"), first) << "a new version read as the old one";
}

TEST_F(Generations, AConsumerOfVersion4IsToldNoGenerationAndReadsAsBefore) {
  start_owner();
  corma::ConsumerConfig config;
  config.protocol_version = 4;
  auto c = corma::testing::run(io, corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(),
                                                            consumer_registry, config))
               .value();
  EXPECT_EQ(c->protocol_version(), 4);
  for (const char* name : {"big", "small"}) {
    auto fetched = corma::testing::run(io, c->async_fetch(name));
    ASSERT_TRUE(fetched) << fetched.error().message();
    EXPECT_FALSE(fetched.value().generation.has_value()) << name;
  }
  // A set too: the `granted` frame an older session reads has no generations.
  std::vector<std::byte> memory(2 << 20);
  auto region = corma::testing::run(io, consumer_registry->async_register(memory, corma::Access::local,
                                                                          asio::use_awaitable))
                    .value();
  std::vector<std::string> names{"big", "small"};
  std::vector<corma::FetchSlot> slots{{&region, 0, 1 << 20}, {&region, 1 << 20, 1 << 20}};
  auto many = corma::testing::run(io, c->async_fetch_many(names, slots));
  ASSERT_TRUE(many) << many.error().message();
  for (const auto& outcome : many.value()) {
    ASSERT_TRUE(outcome) << outcome.error().message();
    EXPECT_FALSE(outcome.value().generation.has_value());
  }
}

}  // namespace
