// Consumer::async_fetch_many and the version 2 batch frames: a set of
// objects in batches of the owner's limit, each object with its own
// outcome; and the owner's answers to hostile batches from a raw client.
#include "rendezvous/rendezvous_fixture.hpp"
#include "support/delaying_proxy.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <optional>
#include <cstring>
#include <string>
#include <thread>

namespace {

using namespace corma::testing::rendezvous;
using corma::Consumer;
using corma::errc;
using corma::FetchSlot;
using corma::ManyFetched;
using corma::Path;
using corma::RegionGuard;
using corma::Result;

constexpr std::size_t objects = 150;
constexpr std::size_t slot_size = 128 * 1024;

class FetchMany : public Rendezvous {
 protected:
  /// Every third object is small (served in chunks: below the RDMA
  /// threshold), the others large enough for RDMA.
  std::vector<std::vector<std::byte>> contents;
  std::vector<std::byte> landing = std::vector<std::byte>((objects + 2) * slot_size);
  RegionGuard destination;

  static std::string name_of(std::size_t i) { return "kv/block-" + std::to_string(i); }

  void start_owner_with_objects(corma::OwnerConfig config = {}) {
    start_owner(64 << 20, config);
    for (std::size_t i = 0; i < objects; ++i) {
      contents.push_back(pattern(i % 3 == 0 ? 1000 + i : 70 * 1024 + i, static_cast<unsigned>(i)));
      owner->publish(name_of(i), corma::PublishedObject{contents.back(), nullptr});
    }
    destination = corma::testing::run(io, consumer_registry->async_register(landing, corma::Access::local,
                                                                            asio::use_awaitable))
                      .value();
  }

  /// Every object into its own slot of the destination region.
  std::pair<std::vector<std::string>, std::vector<FetchSlot>> whole_set() {
    std::vector<std::string> names;
    std::vector<FetchSlot> slots;
    for (std::size_t i = 0; i < objects; ++i) {
      names.push_back(name_of(i));
      slots.push_back(FetchSlot{&destination, i * slot_size, slot_size});
    }
    return {std::move(names), std::move(slots)};
  }

  std::unique_ptr<Consumer> consumer(corma::ConsumerConfig config = {}) {
    auto connected = corma::testing::run(
        io, Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, config));
    if (!connected) throw std::runtime_error(connected.error().message());
    return std::move(connected).value();
  }

  ManyFetched fetch_all(Consumer& c, std::vector<std::string> names, std::vector<FetchSlot> slots) {
    auto fetched = corma::testing::run(io, c.async_fetch_many(std::move(names), std::move(slots)));
    if (!fetched) throw std::runtime_error(fetched.error().message());
    return std::move(fetched).value();
  }

  /// The object `i` arrived whole in slot `i`.
  ::testing::AssertionResult arrived(std::size_t i) const {
    const auto& want = contents[i];
    if (std::memcmp(landing.data() + i * slot_size, want.data(), want.size()) != 0) {
      return ::testing::AssertionFailure() << "object " << i << " differs";
    }
    return ::testing::AssertionSuccess();
  }

  /// Every object arrived by the path its size calls for.
  void expect_whole_set(const ManyFetched& outcomes, std::size_t count = objects) {
    ASSERT_EQ(outcomes.size(), count);
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(outcomes[i]) << i << ": " << outcomes[i].error().message();
      EXPECT_EQ(outcomes[i].value().size, contents[i].size()) << i;
      EXPECT_EQ(outcomes[i].value().path, i % 3 == 0 ? Path::chunked : Path::rdma) << i;
      EXPECT_TRUE(arrived(i));
    }
  }
};

TEST_F(FetchMany, ASetArrivesWholeInBatchesOfTheOwnersLimit) {
  start_owner_with_objects(corma::OwnerConfig{.max_leases_per_connection = 128, .max_batch_objects = 64});
  auto c = consumer();
  EXPECT_EQ(c->protocol_version(), rv::protocol_version);
  auto [names, slots] = whole_set();
  auto outcomes = fetch_all(*c, names, slots);
  expect_whole_set(outcomes);
  // 150 objects in batches of 64: three acquire_many and three release_many.
  EXPECT_EQ(owner->stats().batch_requests, 6U);
  EXPECT_EQ(owner->stats().live_leases, 0U);
  EXPECT_EQ(c->stats().decisions.rdma, 100U);
  EXPECT_EQ(c->stats().decisions.chunked_by_reason["below_threshold"], 50U);

  // Again, warm: the same set, the same bytes, no new registration on the owner.
  const auto registered = owner->stats().exports_registered;
  std::fill(landing.begin(), landing.end(), std::byte{0});
  expect_whole_set(fetch_all(*c, names, slots));
  EXPECT_EQ(owner->stats().exports_registered, registered);
}

TEST_F(FetchMany, ObjectsInChunksShareOnePullWindowSoASetCostsRoundTripsByTheWindow) {
  start_owner_with_objects();
  // A 20 ms round trip between consumer and owner; every object in chunks
  // (one chunk each), eight pulls on the wire at once.
  constexpr auto one_way = std::chrono::milliseconds(10);
  corma::testing::DelayingProxy proxy(io, acceptor.local_endpoint(), one_way);
  corma::ConsumerConfig chunks_only;
  chunks_only.use_rdma = false;
  auto connected =
      corma::testing::run(io, Consumer::connect(io.get_executor(), proxy.endpoint(), consumer_registry, chunks_only));
  ASSERT_TRUE(connected) << connected.error().message();
  auto [names, slots] = whole_set();
  const auto start = std::chrono::steady_clock::now();
  auto outcomes = fetch_all(*connected.value(), names, slots);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(outcomes.size(), objects);
  for (std::size_t i = 0; i < objects; ++i) {
    ASSERT_TRUE(outcomes[i]) << i << ": " << outcomes[i].error().message();
    EXPECT_EQ(outcomes[i].value().path, Path::chunked) << i;
    EXPECT_TRUE(arrived(i));
  }
  // One object after the other would take a round trip each (150 x 20 ms =
  // 3 s); one window of 8 over the set takes about 150 / 8 of them, plus a
  // few for the batches' acquires and releases.
  EXPECT_LT(took, objects * 2 * one_way / 4) << "the pulls of a set did not overlap across objects";
}

TEST_F(FetchMany, ObjectsLandInArenaSlicesByEitherPathWithNoRegistrationOfTheirOwn) {
  start_owner_with_objects();
  constexpr std::size_t count = 30;
  auto arena = corma::testing::run(io, consumer_registry->async_make_arena(
                                           count * slot_size, corma::ArenaConfig{.min_slice = 1024, .max_slice = slot_size},
                                           asio::use_awaitable))
                   .value();
  std::vector<RegionGuard> slices;
  slices.reserve(count);
  std::vector<std::string> names;
  std::vector<FetchSlot> slots;
  for (std::size_t i = 0; i < count; ++i) {
    slices.push_back(arena.allocate(contents[i].size()).value());
    names.push_back(name_of(i));
    slots.push_back(FetchSlot{&slices.back(), 0, slices.back().size()});
  }
  auto c = consumer();
  const auto registrations = consumer_registry->stats().registrations;
  auto outcomes = fetch_all(*c, names, slots);
  ASSERT_EQ(outcomes.size(), count);
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_TRUE(outcomes[i]) << i << ": " << outcomes[i].error().message();
    EXPECT_EQ(outcomes[i].value().path, i % 3 == 0 ? Path::chunked : Path::rdma) << i;
    EXPECT_EQ(std::memcmp(slices[i].data(), contents[i].data(), contents[i].size()), 0) << "object " << i;
  }
  EXPECT_EQ(consumer_registry->stats().registrations, registrations) << "a fetch registered its own destination";
}

TEST_F(FetchMany, EachObjectFailsAlone) {
  start_owner_with_objects();
  auto c = consumer();
  auto [names, slots] = whole_set();
  names.resize(6);
  slots.resize(6);
  names[2] = "no/such/object";
  slots[4].capacity = 10;  // object 4 is large: it does not fit
  slots[5].region = nullptr;
  names.push_back(std::string(corma::rendezvous::max_name_length + 1, 'n'));
  slots.push_back(FetchSlot{&destination, 7 * slot_size, slot_size});
  names.push_back(name_of(8));
  slots.push_back(FetchSlot{&destination, destination.size() - 10, slot_size});  // past the region's end
  auto outcomes = fetch_all(*c, names, slots);
  ASSERT_EQ(outcomes.size(), 8U);
  EXPECT_TRUE(outcomes[0] && arrived(0));
  EXPECT_TRUE(outcomes[1] && arrived(1));
  EXPECT_TRUE(outcomes[3] && arrived(3));
  ASSERT_FALSE(outcomes[2]);
  EXPECT_TRUE(outcomes[2].error().is(errc::region_not_found)) << outcomes[2].error().message();
  ASSERT_FALSE(outcomes[4]);
  EXPECT_TRUE(outcomes[4].error().is(errc::out_of_range)) << outcomes[4].error().message();
  ASSERT_FALSE(outcomes[5]);
  EXPECT_TRUE(outcomes[5].error().is(errc::region_not_found));
  ASSERT_FALSE(outcomes[6]);
  EXPECT_TRUE(outcomes[6].error().is(errc::out_of_range)) << "a name the owner would refuse is not sent";
  ASSERT_FALSE(outcomes[7]);
  EXPECT_TRUE(outcomes[7].error().is(errc::out_of_range));
  EXPECT_EQ(owner->stats().live_leases, 0U) << "the lease of the object that did not fit was released";
  // The connection is still in step.
  auto again = fetch_all(*c, {name_of(1)}, {FetchSlot{&destination, slot_size, slot_size}});
  EXPECT_TRUE(again[0] && arrived(1));
}

TEST_F(FetchMany, NamesAndSlotsOfDifferentLengthsAreRefusedWhole) {
  start_owner_with_objects();
  auto c = consumer();
  auto fetched = corma::testing::run(
      io, c->async_fetch_many({name_of(0), name_of(1)}, {FetchSlot{&destination, 0, slot_size}}));
  ASSERT_FALSE(fetched);
  EXPECT_TRUE(fetched.error().is(errc::out_of_range));
  EXPECT_EQ(owner->stats().batch_requests, 0U);
  EXPECT_EQ(owner->stats().connections, 1U);
}

TEST_F(FetchMany, FailedRdmaReadsFallBackToChunksExactlyOnceEach) {
  start_owner_with_objects();
  consumer_backend->set_faults(corma::testing::TestBackendFaults{.fail_transfers = true});
  auto c = consumer();
  auto [names, slots] = whole_set();
  auto outcomes = fetch_all(*c, names, slots);
  for (std::size_t i = 0; i < objects; ++i) {
    ASSERT_TRUE(outcomes[i]) << i << ": " << outcomes[i].error().message();
    EXPECT_EQ(outcomes[i].value().path, Path::chunked);
    EXPECT_EQ(outcomes[i].value().fell_back(), i % 3 != 0) << i;
    if (i % 3 != 0) {
      EXPECT_EQ(outcomes[i].value().reason, corma::ChunkedReason::rdma_failed);
    }
    EXPECT_TRUE(arrived(i));
  }
  EXPECT_EQ(c->stats().fallbacks, 100U);
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(FetchMany, AVersionOneConsumerFetchesTheSetOneObjectAtATime) {
  start_owner_with_objects();
  corma::ConsumerConfig version_one;
  version_one.protocol_version = 1;
  auto c = consumer(version_one);
  EXPECT_EQ(c->protocol_version(), 1);
  auto [names, slots] = whole_set();
  expect_whole_set(fetch_all(*c, names, slots));
  EXPECT_EQ(owner->stats().batch_requests, 0U);
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(FetchMany, CancelledDuringTheRdmaReadKeepsItsLeasesUntilTheReadsEndThenReleasesThem) {
  start_owner_with_objects(corma::OwnerConfig{.max_leases_per_connection = 64, .max_batch_objects = 32});
  auto c = consumer();
  auto [names, slots] = whole_set();
  consumer_backend->hold_transfers();
  asio::cancellation_signal cancel;
  std::optional<Result<ManyFetched>> fetched;
  c->async_fetch_many(names, slots, asio::bind_cancellation_slot(cancel.slot(), [&](Result<ManyFetched> r) {
                        fetched.emplace(std::move(r));
                      }));
  // Cancels once the first batch's reads are in flight (held by the
  // backend): its 32 objects, less every third (small, in chunks).
  bool cancel_sent = false;
  std::thread watcher([&] {
    if (consumer_backend->wait_for_transfers_in_flight(32 - 11)) {
      asio::post(io, [&] {
        cancel.emit(asio::cancellation_type::terminal);
        cancel_sent = true;
      });
    }
  });
  const auto cancel_limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!cancel_sent && std::chrono::steady_clock::now() < cancel_limit) io.run_one_for(std::chrono::milliseconds(50));
  watcher.join();
  ASSERT_TRUE(cancel_sent) << "the reads never were all in flight";
  // The reads go on after the cancellation, under their leases: the set is
  // not answered, and no lease goes back, while the reads are held (the
  // owner's memory they read must stay; a provider cannot stop a read).
  const auto held_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < held_until) io.run_one_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(fetched.has_value()) << "answered while its reads still ran";
  EXPECT_GE(owner->stats().live_leases, 32U - 11U) << "a lease went back while its read still ran";
  consumer_backend->release_transfers();
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fetched && std::chrono::steady_clock::now() < limit) io.run_one_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(consumer_backend->wait_for_transfers_in_flight(0));
  ASSERT_TRUE(fetched.has_value());
  ASSERT_TRUE(*fetched) << fetched->error().message();
  std::size_t cancelled = 0;
  for (std::size_t i = 0; i < objects; ++i) {
    const auto& outcome = fetched->value()[i];
    if (outcome) {
      EXPECT_TRUE(arrived(i)) << "what succeeded is whole";
    } else {
      EXPECT_TRUE(outcome.error().is(errc::cancelled)) << i << ": " << outcome.error().message();
      ++cancelled;
    }
  }
  EXPECT_GE(cancelled, objects - 32) << "nothing after the cancelled batch was fetched";
  EXPECT_EQ(owner->stats().live_leases, 0U) << "the cancelled batch's leases were released";
  // The connection is in step: the next set is served whole.
  std::fill(landing.begin(), landing.end(), std::byte{0});
  expect_whole_set(fetch_all(*c, names, slots));
}

TEST_F(FetchMany, TwoSetsAtOnceImportEachKeyOnceAndLeakNone) {
  start_owner_with_objects();
  auto c = consumer();
  auto [names, slots] = whole_set();
  std::vector<std::byte> second_landing(landing.size());
  auto second = corma::testing::run(io, consumer_registry->async_register(second_landing, corma::Access::local,
                                                                          asio::use_awaitable))
                    .value();
  std::vector<FetchSlot> second_slots = slots;
  for (auto& slot : second_slots) slot.region = &second;
  std::optional<Result<ManyFetched>> first_set;
  std::optional<Result<ManyFetched>> second_set;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    // Both sets need the same keys at the same moment.
    asio::co_spawn(io, [&]() -> asio::awaitable<void> { first_set = co_await c->async_fetch_many(names, slots); },
                   asio::detached);
    second_set = co_await c->async_fetch_many(names, second_slots);
    co_await until([&] { return first_set.has_value(); }, std::chrono::seconds(10));
  }());
  ASSERT_TRUE(first_set && *first_set && second_set && *second_set);
  // One export per large object, so one key each: imported once, however
  // many fetches wanted it at once.
  const std::size_t large = objects - (objects + 2) / 3;
  EXPECT_EQ(consumer_backend->imported_keys(), large) << "a key imported twice at once was left imported";
}

TEST_F(FetchMany, KeysPastTheImportLimitLetGoOnlyThoseNoReadUses) {
  // 100 exports in batches of 64 against a limit of 8 imported keys: every
  // import past the eighth finds the table full while the batch's own keys
  // wait for their gets. Not one of those may be let go (its get would
  // name a key released under it and fall back to chunks).
  start_owner_with_objects(corma::OwnerConfig{.max_leases_per_connection = 128, .max_batch_objects = 64});
  corma::ConsumerConfig few_keys;
  few_keys.max_imported_keys = 8;
  auto c = consumer(few_keys);
  auto [names, slots] = whole_set();
  expect_whole_set(fetch_all(*c, names, slots));
  EXPECT_EQ(c->stats().fallbacks, 0U) << "a get named a key let go under it";
  // Between sets nothing is in use: the table is cut back to its limit (and
  // the keys the last batch imported after the cut).
  const std::size_t large_in_last_batch = 64 - (64 + 2) / 3 + 1;
  EXPECT_LE(consumer_backend->imported_keys(), few_keys.max_imported_keys + large_in_last_batch);
  std::fill(landing.begin(), landing.end(), std::byte{0});
  expect_whole_set(fetch_all(*c, names, slots));
  EXPECT_EQ(c->stats().fallbacks, 0U);
}

TEST_F(FetchMany, AnObjectPublishedAgainWhileItsBatchIsReadFailsAloneWithObjectChanged) {
  start_owner_with_objects();
  auto c = consumer();
  std::vector<std::string> names = {name_of(1), name_of(2), name_of(4)};
  std::vector<FetchSlot> slots = {FetchSlot{&destination, slot_size, slot_size},
                                  FetchSlot{&destination, 2 * slot_size, slot_size},
                                  FetchSlot{&destination, 4 * slot_size, slot_size}};
  const auto replacement = pattern(contents[2].size(), 77);
  consumer_backend->hold_transfers();
  std::optional<Result<ManyFetched>> fetched;
  c->async_fetch_many(names, slots, [&](Result<ManyFetched> r) { fetched.emplace(std::move(r)); });
  // While the batch's reads are held (objects 1, 2 and 4 are all large:
  // three RDMA reads), object 2 is published again; then the reads go on.
  std::thread watcher([&] {
    if (consumer_backend->wait_for_transfers_in_flight(3)) {
      asio::post(io, [&] {
        owner->publish(name_of(2), corma::PublishedObject{replacement, nullptr});
        consumer_backend->release_transfers();
      });
    }
  });
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fetched && std::chrono::steady_clock::now() < limit) io.run_one_for(std::chrono::milliseconds(50));
  watcher.join();
  ASSERT_TRUE(fetched.has_value());
  ASSERT_TRUE(*fetched) << fetched->error().message();
  const auto& outcomes = fetched->value();
  EXPECT_TRUE(outcomes[0] && arrived(1));
  EXPECT_TRUE(outcomes[2] && arrived(4));
  ASSERT_FALSE(outcomes[1]) << "a read that may mix two publications is never reported whole";
  EXPECT_TRUE(outcomes[1].error().is(errc::object_changed)) << outcomes[1].error().message();
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

// ---- hostile batches from a raw client ---------------------------------------------

TEST_F(Rendezvous, ABatchOverTheOwnersLimitIsRefusedWholeAndTheConnectionServesOn) {
  start_owner(64 << 20, corma::OwnerConfig{.max_leases_per_connection = 128, .max_batch_objects = 64});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto request1 = message(rv::Hello{});
    auto hello = co_await client.ask(std::move(request1));
    auto* ok = hello ? std::get_if<rv::HelloOk>(&hello.value()) : nullptr;
    EXPECT_TRUE(ok != nullptr && ok->version == rv::protocol_version && ok->max_batch == 64);
    rv::AcquireMany thousand;
    for (int i = 0; i < 1000; ++i) thousand.names.push_back("big");
    auto request2 = message(std::move(thousand));
    auto refused = co_await client.ask(std::move(request2));
    EXPECT_TRUE(is_error(refused, errc::budget_exceeded));
    EXPECT_EQ(owner->stats().live_leases, 0U) << "no name of a refused batch was looked at";
    // The lease cap still holds inside an allowed batch: 64 per connection.
    rv::AcquireMany allowed;
    for (int i = 0; i < 64; ++i) allowed.names.push_back(i % 2 == 0 ? "big" : "missing");
    auto request3 = message(std::move(allowed));
    auto granted = co_await client.ask(std::move(request3));
    auto* answers = granted ? std::get_if<rv::Granted>(&granted.value()) : nullptr;
    EXPECT_TRUE(answers != nullptr && answers->grants.size() == 64U);
    if (answers != nullptr) {
      for (std::size_t i = 0; i < answers->grants.size(); ++i) {
        EXPECT_EQ(std::holds_alternative<rv::NotFound>(answers->grants[i]), i % 2 == 1) << i;
      }
    }
    EXPECT_EQ(owner->stats().live_leases, 32U);
    auto request4 = message(rv::Acquire{"small", false});
    auto single = co_await client.ask(std::move(request4));
    EXPECT_TRUE(single && std::holds_alternative<rv::Chunked>(single.value()));
  }());
}

TEST_F(Rendezvous, TheLeaseCapAnswersEachObjectOfABatchOverIt) {
  start_owner(64 << 20, corma::OwnerConfig{.max_leases_per_connection = 4, .max_batch_objects = 8});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello_request = message(rv::Hello{});
    auto hello = co_await client.ask(std::move(hello_request));
    auto* ok = hello ? std::get_if<rv::HelloOk>(&hello.value()) : nullptr;
    EXPECT_TRUE(ok != nullptr && ok->max_batch == 2) << "half the lease cap, so two batches may be leased";
    for (int i = 0; i < 3; ++i) {
      auto single = message(rv::Acquire{"small", false});
      (void)co_await client.ask(std::move(single));
    }
    auto pair = message(rv::AcquireMany{{"small", "big"}, false});
    auto granted = co_await client.ask(std::move(pair));
    auto* answers = granted ? std::get_if<rv::Granted>(&granted.value()) : nullptr;
    EXPECT_TRUE(answers != nullptr && answers->grants.size() == 2U);
    if (answers == nullptr) co_return;
    EXPECT_TRUE(std::holds_alternative<rv::Chunked>(answers->grants[0]));
    auto* error = std::get_if<rv::ErrorReply>(&answers->grants[1]);
    EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::budget_exceeded));
    EXPECT_EQ(owner->stats().live_leases, 4U);
  }());
}

TEST_F(Rendezvous, ReleasesOfForeignLeasesInABatchAreNamedAndLeaveThemAlone) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto a = co_await RawClient::connect(acceptor.local_endpoint());
    auto b = co_await RawClient::connect(acceptor.local_endpoint());
    auto request7 = message(rv::Hello{});
    (void)co_await a.ask(std::move(request7));
    auto request8 = message(rv::Hello{});
    (void)co_await b.ask(std::move(request8));
    auto request9 = message(rv::Acquire{"big", false});
    auto acquired = co_await a.ask(std::move(request9));
    auto* chunked = acquired ? std::get_if<rv::Chunked>(&acquired.value()) : nullptr;
    EXPECT_TRUE(chunked != nullptr);
    if (chunked == nullptr) co_return;
    const auto lease = chunked->lease;
    auto request10 = message(rv::Acquire{"small", false});
    auto own = co_await b.ask(std::move(request10));
    const auto b_lease = std::get<rv::Chunked>(own.value()).lease;
    rv::ReleaseMany foreign{{lease, lease + 1000, b_lease}};
    auto request11 = message(std::move(foreign));
    auto answer = co_await b.ask(std::move(request11));
    auto* codes = answer ? std::get_if<rv::ReleasedMany>(&answer.value()) : nullptr;
    EXPECT_TRUE(codes != nullptr && codes->codes.size() == 3U);
    if (codes != nullptr) {
      EXPECT_EQ(codes->codes[0], static_cast<std::uint16_t>(errc::region_not_found));
      EXPECT_EQ(codes->codes[1], static_cast<std::uint16_t>(errc::region_not_found));
      EXPECT_EQ(codes->codes[2], 0U) << "b's own lease is released";
    }
    // a's lease survived: a still reads from it.
    auto request12 = message(rv::Pull{lease, 0, 100});
    auto pulled = co_await a.ask(std::move(request12));
    EXPECT_TRUE(pulled && std::holds_alternative<rv::Data>(pulled.value()));
    EXPECT_EQ(owner->stats().live_leases, 1U);
  }());
}

TEST_F(Rendezvous, VersionOneSessionsAreAnsweredInVersionOneWithoutBatches) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto request13 = message(rv::Hello{1, {}, {}});
    auto hello = co_await client.ask(std::move(request13));
    auto* ok = hello ? std::get_if<rv::HelloOk>(&hello.value()) : nullptr;
    EXPECT_TRUE(ok != nullptr && ok->version == 1 && ok->max_batch == 0);
    auto request14 = message(rv::AcquireMany{{"big"}, false});
    auto batch = co_await client.ask(std::move(request14));
    EXPECT_TRUE(is_error(batch, errc::protocol));
    auto request15 = message(rv::ReleaseMany{{1}});
    auto release = co_await client.ask(std::move(request15));
    EXPECT_TRUE(is_error(release, errc::protocol));
    EXPECT_EQ(owner->stats().live_leases, 0U);
    auto request16 = message(rv::Acquire{"small", false});
    auto single = co_await client.ask(std::move(request16));
    EXPECT_TRUE(single && std::holds_alternative<rv::Chunked>(single.value())) << "the connection serves on";
  }());
}

TEST_F(Rendezvous, ANewerConsumerIsAnsweredInThisOwnersVersion) {
  start_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto request17 = message(rv::Hello{rv::protocol_version + 5, {}, {}});
    auto hello = co_await client.ask(std::move(request17));
    auto* ok = hello ? std::get_if<rv::HelloOk>(&hello.value()) : nullptr;
    EXPECT_TRUE(ok != nullptr && ok->version == rv::protocol_version);
  }());
}

}  // namespace
