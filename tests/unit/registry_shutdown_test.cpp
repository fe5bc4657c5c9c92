// Registry shutdown and the deregistered() latch.
#include "support/registry_fixture.hpp"

#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <future>
#include <optional>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::errc;
using corma::OwnedBuffer;
using corma::RegionGuard;
using corma::Registry;
using corma::Result;
using corma::testing::page_size;
using corma::testing::RegistryTest;
using corma::testing::TestBackend;
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

/// An owned registration admitted before shutdown and mapped after the gate
/// closed, so rolled back, its unmap meeting `faults`: its outcome, and the
/// shutdown still to come.
std::pair<corma::OwnedResult, std::future<Result<void>>> roll_back_across_shutdown(
    Registry& registry, TestBackend& backend, TestBackendFaults faults) {
  backend.hold_maps();
  auto late = registry.async_register_owned(OwnedBuffer::allocate(page_size()), Access::remote_read,
                                            asio::use_future);
  EXPECT_TRUE(backend.wait_for_held_maps(1));
  auto shutdown = registry.async_shutdown(deadline, asio::use_future);
  backend.set_faults(faults);
  backend.release_maps();
  return {late.get(), std::move(shutdown)};
}

TEST_F(RegistryTest, ARegistrationRolledBackDuringShutdownHandsItsBufferBack) {
  auto registry = make_registry();
  auto [outcome, shutdown] = roll_back_across_shutdown(registry, *backend, {});
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().error.is(errc::shutting_down));
  EXPECT_TRUE(outcome.error().buffer) << "a confirmed rollback hands the buffer back";
  EXPECT_TRUE(shutdown.get());
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  EXPECT_EQ(registry.stats().regions, 0u);
}

TEST_F(RegistryTest, ARegistrationWhoseRollbackIsRefusedStaysAccountedUntilShutdownReleasesIt) {
  auto registry = make_registry();
  auto [outcome, shutdown] = roll_back_across_shutdown(registry, *backend, {.refuse_unmap = true});
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().error.is(errc::shutting_down));
  EXPECT_FALSE(outcome.error().buffer) << "the provider may still touch it";
  // Still registered as far as anyone knows: charged, to a region.
  auto stats = registry.stats();
  EXPECT_EQ(stats.registered_bytes, page_size());
  EXPECT_EQ(stats.regions, 1u);
  EXPECT_EQ(stats.reserved_bytes, 0u);

  // The backend's own shutdown unmaps everything: then it is released.
  EXPECT_TRUE(backend->async_shutdown(asio::use_future).get());
  auto done = shutdown.get();
  EXPECT_TRUE(done) << done.error().message();
  stats = registry.stats();
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.regions, 0u);
  EXPECT_EQ(stats.leaked_owned_buffers, 0u);
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

TEST_F(RegistryTest, ShutdownReportsRegistrationsTheBackendStillHoldsAtItsDeadline) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = register_now(registry, memory).value();
  backend->set_faults(TestBackendFaults{.refuse_unmap = true});
  // The backend may yet let go (it might be draining a shutdown of its own):
  // the registry keeps looking until its deadline.
  auto outcome = registry.async_shutdown(std::chrono::milliseconds(200), asio::use_future).get();
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::timeout)) << outcome.error().message();
  EXPECT_NE(outcome.error().message().find("1 registrations still live"), std::string::npos)
      << outcome.error().message();
  EXPECT_FALSE(guard.deregistered().is_set());
  EXPECT_EQ(registry.stats().registered_bytes, guard.charged_bytes());
  backend->set_faults(TestBackendFaults{});
  EXPECT_TRUE(guard.async_deregister(asio::use_future).get());
}

TEST_F(RegistryTest, ShutdownWaitsForABackendStillDrainingATransferItsCallerGaveUpOn) {
  auto target = TestBackend::create();
  std::vector<std::byte> source(page_size(), std::byte{0x5A}), destination(2 * page_size());
  auto remote_region =
      target->async_map(source.data(), source.size(), Access::remote_read, asio::use_future).get().value();
  auto offer = backend->async_peer_offer(asio::use_future).get().value();
  auto answer = target->async_peer_accept(offer.blob, asio::use_future).get().value();
  ASSERT_TRUE(backend->async_peer_complete(offer.peer, answer.blob, asio::use_future).get());
  const corma::RemoteRegion remote{corma::testing::test_backend_id, 1, remote_region.effective_addr,
                                   source.size(), remote_region.packed_key};

  auto registry = make_registry();
  auto pinned = register_now(registry, std::span(destination).first(page_size()), Access::local).value();
  auto idle = register_now(registry, std::span(destination).last(page_size()), Access::local).value();
  std::vector<std::future<Result<void>>> waiters;
  for (const auto* guard : {&pinned, &idle}) waiters.push_back(guard->deregistered().async_wait(asio::use_future));

  // The caller gives up on a transfer the backend still runs: the registry
  // no longer waits for it, the backend still pins its region.
  backend->hold_transfers();
  asio::cancellation_signal signal;
  std::optional<Result<void>> got;
  pinned.async_get(offer.peer, remote, {0, 0, source.size()},
                   asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<void> r) { got = r; })));
  ASSERT_TRUE(backend->wait_for_transfers_in_flight(1));
  signal.emit(asio::cancellation_type::terminal);
  while (!got) ASSERT_GT(io.run_one_for(std::chrono::seconds(5)), 0u);
  EXPECT_TRUE(got->error().is(errc::cancelled));

  // The backend first: it drains the held transfer, refusing our unmaps
  // meanwhile and still holding both registrations.
  auto backend_down = backend->async_shutdown(asio::use_future);
  auto registry_down = registry.async_shutdown(deadline, asio::use_future);
  ASSERT_TRUE(backend->wait_for_live(2));
  backend->release_transfers();

  ASSERT_EQ(registry_down.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto outcome = registry_down.get();
  EXPECT_TRUE(outcome) << outcome.error().message();
  EXPECT_TRUE(backend_down.get());
  for (auto& waiter : waiters) {
    ASSERT_EQ(waiter.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_TRUE(waiter.get());
  }
  EXPECT_EQ(backend->live_registrations(), 0u);
  const auto stats = registry.stats();
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.regions, 0u);
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
