// Registry shutdown and the deregistered() latch.
#include "support/registry_fixture.hpp"

#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::errc;
using corma::RegionGuard;
using corma::Result;
using corma::testing::page_size;
using corma::testing::RegistryTest;
using corma::testing::TestBackendFaults;

constexpr auto deadline = std::chrono::seconds(10);

TEST_F(RegistryTest, ShutdownDeregistersEverythingAndRefusesNewWork) {
  auto registry = make_registry();
  std::vector<std::byte> memory(8 * page_size());
  std::vector<RegionGuard> guards;
  for (int i = 0; i < 4; ++i) {
    guards.push_back(register_now(registry, std::span(memory).subspan(i * page_size(), page_size())).value());
  }
  EXPECT_EQ(backend->live_registrations(), 4u);

  EXPECT_TRUE(registry.async_shutdown(deadline, asio::use_future).get());
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  for (auto& g : guards) EXPECT_TRUE(g.deregistered().is_set());

  auto refused = register_now(registry, memory);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::shutting_down));
  EXPECT_EQ(registry.stats().refused_shutting_down, 1u);

  // Idempotent: a second call answers the same, at once.
  EXPECT_TRUE(registry.async_shutdown(deadline, asio::use_future).get());
  // A guard of a shut-down registry deregisters as a no-op.
  EXPECT_TRUE(guards[0].async_deregister(asio::use_future).get());
}

TEST_F(RegistryTest, ShutdownDoesNotMissARegistrationAdmittedJustBeforeIt) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  backend->hold_maps();  // the registration is admitted and sits in the backend
  auto late = registry.async_register(memory, Access::remote_read, asio::use_future);
  ASSERT_TRUE(backend->wait_for_held_maps(1));

  auto shutdown = registry.async_shutdown(deadline, asio::use_future);
  backend->release_maps();  // the map now succeeds, after the gate closed

  auto outcome = late.get();
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::shutting_down)) << outcome.error().message();
  EXPECT_TRUE(shutdown.get());
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  EXPECT_EQ(registry.stats().reserved_bytes, 0u);
}

TEST_F(RegistryTest, ShutdownWithADelayedMapInFlight) {
  backend->set_faults(TestBackendFaults{.map_delay = std::chrono::milliseconds(50)});
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto late = registry.async_register(memory, Access::remote_read, asio::use_future);
  auto shutdown = registry.async_shutdown(deadline, asio::use_future);
  auto outcome = late.get();
  EXPECT_TRUE(shutdown.get());
  // Either it was refused at the gate or rolled back: nothing stays behind.
  if (outcome) {
    EXPECT_TRUE(outcome.value().deregistered().is_set());
  } else {
    EXPECT_TRUE(outcome.error().is(errc::shutting_down));
  }
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
}

TEST_F(RegistryTest, ShutdownLatchesUnconfirmedRegionsOnceTheBackendHoldsNone) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = register_now(registry, memory).value();
  auto event = guard.deregistered();
  backend->set_faults(TestBackendFaults{.refuse_unmap = true});
  guard = RegionGuard{};  // background unmap, refused
  // The backend is shut down first (it unmaps everything), then the registry.
  EXPECT_TRUE(backend->async_shutdown(asio::use_future).get());
  EXPECT_TRUE(registry.async_shutdown(deadline, asio::use_future).get());
  EXPECT_TRUE(event.is_set());
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
}

TEST_F(RegistryTest, ShutdownReportsRegistrationsTheBackendStillHolds) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = register_now(registry, memory).value();
  backend->set_faults(TestBackendFaults{.refuse_unmap = true});
  auto outcome = registry.async_shutdown(deadline, asio::use_future).get();
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::backend)) << outcome.error().message();
  EXPECT_FALSE(guard.deregistered().is_set());
  EXPECT_EQ(registry.stats().registered_bytes, guard.charged_bytes());
  backend->set_faults(TestBackendFaults{});
  EXPECT_TRUE(guard.async_deregister(asio::use_future).get());
}

TEST_F(RegistryTest, ShutdownPastItsDeadlineAnswersTimeout) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  backend->hold_maps();
  auto late = registry.async_register(memory, Access::remote_read, asio::use_future);
  ASSERT_TRUE(backend->wait_for_held_maps(1));
  auto outcome = registry.async_shutdown(std::chrono::milliseconds(10), asio::use_future).get();
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::timeout));
  backend->release_maps();
  EXPECT_FALSE(late.get());
  EXPECT_TRUE(backend->wait_for_live(0));
}

TEST_F(RegistryTest, DeregisteredHasNoLostWakeUp) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  constexpr int rounds = 2000;
  int lost = 0;
  for (int i = 0; i < rounds; ++i) {
    auto guard = register_now(registry, memory).value();
    auto event = guard.deregistered();
    std::atomic<bool> go{false};
    // The release races the wait; the spin sweeps which one comes first.
    std::thread releaser([&] {
      while (!go.load(std::memory_order_acquire)) {
      }
      guard = RegionGuard{};
    });
    go.store(true, std::memory_order_release);
    std::atomic<int> spin{0};
    while (spin.fetch_add(1, std::memory_order_relaxed) < (i % 200) * 20) {
    }
    auto waited = event.async_wait(asio::use_future);
    if (waited.wait_for(std::chrono::seconds(5)) != std::future_status::ready || !waited.get()) ++lost;
    releaser.join();
  }
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(RegistryTest, WaitingForDeregistrationCanBeCancelled) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = register_now(registry, memory).value();
  asio::cancellation_signal signal;
  std::optional<Result<void>> outcome;
  guard.deregistered().async_wait(asio::bind_cancellation_slot(
      signal.slot(), asio::bind_executor(io, [&](Result<void> r) { outcome = r; })));
  signal.emit(asio::cancellation_type::terminal);
  io.run_for(std::chrono::seconds(5));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(outcome->error().is(errc::cancelled));
}

}  // namespace
