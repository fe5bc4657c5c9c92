// A streamed fetch with a landing (Consumer::async_fetch_to with a
// StreamDestination, as `corma get` writes a file): an RDMA read, whole or
// in windows, lands in the caller's memory for good and the sink is not
// handed it; chunks, and the chunks of a fallback, go to the sink; a
// landing the backend cannot register is replaced by fresh memory handed to
// the sink; a landing that cannot be had fails the fetch and releases its
// lease; a cancellation reaching the landing's registration answers
// `cancelled`.
#include "rendezvous/rendezvous_fixture.hpp"

#include <cstring>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;
using corma::Path;
using corma::testing::TestBackendFaults;

constexpr std::uint64_t MiB = 1 << 20;

/// Landing memory of the test's own: how often it was asked for, and
/// whether the consumer still holds its keepalive.
struct TestLanding {
  std::vector<std::byte> memory;
  std::size_t asked = 0;
  std::uint64_t short_by = 0;  ///< hands out this much less than asked for
  std::weak_ptr<const void> held;

  corma::LandingFor landing() {
    return [this](std::uint64_t size) -> corma::Result<corma::Landing> {
      ++asked;
      if (memory.size() != size) memory.assign(size, std::byte{0});
      auto keepalive = std::make_shared<int>(0);
      held = keepalive;
      return corma::Landing{std::span(memory).first(size - short_by), std::move(keepalive)};
    };
  }
};

class Landing : public Rendezvous {
 protected:
  CollectingSink collected;
  TestLanding landed;

  corma::StreamDestination destination() { return corma::StreamDestination{collected.sink(), landed.landing()}; }

  corma::Result<corma::FetchOutcome> fetch_to(std::shared_ptr<Registry> registry, std::string name) {
    return corma::testing::run(io, [&]() -> asio::awaitable<corma::Result<corma::FetchOutcome>> {
      CORMA_CO_TRY(auto consumer, co_await connect(std::move(registry)));
      auto to = destination();  // named: g++ 12 destroys temporaries inside co_await twice
      co_return co_await consumer->async_fetch_to(std::move(name), std::move(to));
    }());
  }
};

TEST_F(Landing, AnRdmaReadLandsInTheCallersMemoryAndSkipsTheSink) {
  start_owner();
  auto outcome = fetch_to(consumer_registry, "big");
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_EQ(outcome.value().path, Path::rdma);
  EXPECT_EQ(landed.asked, 1U);
  EXPECT_EQ(landed.memory, big);
  EXPECT_EQ(collected.calls, 0U) << "the bytes are where they belong already";
  EXPECT_TRUE(landed.held.expired()) << "the consumer let the landing go";
  EXPECT_EQ(consumer_registry->stats().registered_bytes, 0U);
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(Landing, AnObjectLentInWindowsLandsWindowByWindowInTheSameMemory) {
  std::vector<std::byte> huge = pattern(10 * MiB + 123, 5);
  start_owner(4 * MiB);
  owner->publish("huge", corma::PublishedObject{huge, nullptr});
  auto outcome = fetch_to(consumer_registry, "huge");
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_EQ(outcome.value().path, Path::rdma);
  EXPECT_GE(outcome.value().windows, 2U);
  EXPECT_EQ(landed.asked, 1U);
  EXPECT_TRUE(landed.memory == huge);
  EXPECT_EQ(collected.calls, 0U);
}

TEST_F(Landing, ChunksGoToTheSinkAndTheLandingIsNeverAskedFor) {
  start_owner();
  auto outcome = fetch_to(nullptr, "big");  // no RDMA offer: chunks
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_EQ(outcome.value().path, Path::chunked);
  EXPECT_EQ(landed.asked, 0U);
  EXPECT_TRUE(collected.in_order);
  EXPECT_EQ(collected.bytes, big);
}

TEST_F(Landing, AFailedRdmaReadFallsBackToChunksInTheSink) {
  start_owner();
  consumer_backend->set_faults(TestBackendFaults{.fail_transfers = true});
  auto outcome = fetch_to(consumer_registry, "big");
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_EQ(outcome.value().path, Path::chunked);
  EXPECT_TRUE(outcome.value().fell_back());
  EXPECT_EQ(landed.asked, 1U) << "the fallback asks for no second landing";
  EXPECT_EQ(collected.bytes, big);
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(Landing, ALandingTheBackendCannotRegisterIsReplacedByFreshMemoryForTheSink) {
  start_owner();
  landed.memory.assign(big.size(), std::byte{0});
  consumer_backend->set_faults(TestBackendFaults{.refuse_maps_in = landed.memory});
  auto outcome = fetch_to(consumer_registry, "big");
  ASSERT_TRUE(outcome) << outcome.error().message();
  EXPECT_EQ(outcome.value().path, Path::rdma) << "still read over RDMA, not a fallback";
  EXPECT_FALSE(outcome.value().fell_back());
  EXPECT_EQ(collected.calls, 1U) << "the sink was handed the object whole";
  EXPECT_EQ(collected.bytes, big);
  EXPECT_EQ(landed.memory, std::vector<std::byte>(big.size())) << "nothing landed in the refused memory";
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(Landing, ALandingThatCannotBeHadFailsTheFetchAndReleasesItsLease) {
  start_owner();
  landed.short_by = 1;
  auto too_small = fetch_to(consumer_registry, "big");
  ASSERT_FALSE(too_small);
  EXPECT_TRUE(too_small.error().is(errc::out_of_range)) << too_small.error().message();
  EXPECT_EQ(owner->stats().live_leases, 0U);

  auto refused = corma::testing::run(io, [&]() -> asio::awaitable<corma::Result<corma::FetchOutcome>> {
    CORMA_CO_TRY(auto consumer, co_await connect(consumer_registry));
    corma::LandingFor failing = [](std::uint64_t) -> corma::Result<corma::Landing> {
      return corma::fail(errc::backend, "no room on the disk");
    };
    corma::StreamDestination nowhere{collected.sink(), failing};
    auto failed = co_await consumer->async_fetch_to("big", std::move(nowhere));
    // The connection goes on: the next fetch is served.
    auto next = co_await consumer->async_fetch("small");
    EXPECT_TRUE(next) << next.error().message();
    co_return failed;
  }());
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::backend)) << refused.error().message();
  EXPECT_EQ(owner->stats().live_leases, 0U);
  EXPECT_EQ(collected.calls, 0U);
}

TEST_F(Landing, ACancellationReachingTheLandingsRegistrationAnswersCancelled) {
  start_owner();
  // The landing's registration is still in flight when the signal comes: it
  // is emitted from the io_context once the landing was handed out.
  consumer_backend->set_faults(TestBackendFaults{.map_delay = std::chrono::milliseconds(300)});
  asio::cancellation_signal cancel;
  auto inner = landed.landing();
  corma::LandingFor landing = [&](std::uint64_t size) {
    asio::post(io, [&cancel] { cancel.emit(asio::cancellation_type::terminal); });
    return inner(size);
  };
  auto outcome = corma::testing::run(io, [&]() -> asio::awaitable<corma::Result<corma::FetchOutcome>> {
    CORMA_CO_TRY(auto consumer, co_await connect(consumer_registry));
    corma::StreamDestination to{collected.sink(), landing};
    co_return co_await consumer->async_fetch_to("big", std::move(to),
                                                asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
  }());
  ASSERT_FALSE(outcome) << "the fetch went on through the sink";
  EXPECT_TRUE(outcome.error().is(errc::cancelled)) << outcome.error().message();
  EXPECT_EQ(landed.asked, 1U);
  EXPECT_EQ(collected.calls, 0U) << "nothing reaches the sink of a cancelled fetch";
  EXPECT_EQ(owner->stats().live_leases, 0U) << "the lease is released";
  EXPECT_EQ(consumer_registry->stats().registered_bytes, 0U) << "the cancelled registration left nothing";
}

}  // namespace
