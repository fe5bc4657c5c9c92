// Registry and RegionGuard: budget, cancellation, ownership, background
// deregistration, transfers.
#include "support/registry_fixture.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
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

TEST_F(RegistryTest, ConcurrentRegistrationsNeverOvershootTheBudget) {
  const std::uint64_t budget = 16 * page_size();
  auto registry = make_registry(budget);
  auto memory = OwnedBuffer::allocate(64 * page_size());

  std::mutex mutex;
  std::vector<RegionGuard> live;  // every guard handed out and not yet dropped
  std::vector<corma::DeregisteredEvent> events;
  std::atomic<std::uint64_t> granted{0}, refused{0};
  std::atomic<bool> overshoot{false};

  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 300; ++i) {
      const std::size_t pages = 1 + rng() % 4;
      const std::size_t first = rng() % (64 - pages);
      auto guard = register_now(registry, memory.bytes().subspan(first * page_size(), pages * page_size()));
      std::lock_guard lock(mutex);
      if (guard) {
        ++granted;
        events.push_back(guard.value().deregistered());
        live.push_back(std::move(guard).value());
      } else {
        EXPECT_TRUE(guard.error().is(errc::budget_exceeded)) << guard.error().message();
        ++refused;
      }
      std::uint64_t held = 0;
      for (auto& g : live) held += g.charged_bytes();
      if (held > budget || registry.stats().registered_bytes > budget) overshoot = true;
      if (live.size() > 2 && rng() % 2 == 0) live.erase(live.begin() + static_cast<long>(rng() % live.size()));
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 8; ++t) threads.emplace_back(worker, t + 1);
  for (auto& t : threads) t.join();

  EXPECT_FALSE(overshoot);
  EXPECT_GT(granted.load(), 0u);
  EXPECT_GT(refused.load(), 0u) << "the budget was never under pressure";
  live.clear();
  for (auto& e : events) ASSERT_TRUE(wait_released(e));
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  EXPECT_EQ(registry.stats().reserved_bytes, 0u);
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().registrations, granted.load());
  EXPECT_EQ(registry.stats().refused_budget, refused.load());
}

TEST_F(RegistryTest, TimeoutAroundADelayedMapGivesTheBudgetBack) {
  backend->set_faults(TestBackendFaults{.map_delay = std::chrono::seconds(30)});
  auto registry = make_registry();
  std::vector<std::byte> memory(3 * page_size());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    asio::steady_timer timer(io, std::chrono::milliseconds(20));
    auto winner = co_await (registry.async_register(memory, Access::remote_read, asio::use_awaitable) ||
                            timer.async_wait(asio::use_awaitable));
    EXPECT_EQ(winner.index(), 1u) << "the map was supposed to be slower than the timer";
  }());
  EXPECT_EQ(backend->live_registrations(), 0u);
  const auto stats = registry.stats();
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.cancelled, 1u);
  EXPECT_EQ(stats.regions, 0u);
}

TEST_F(RegistryTest, OwnedRegistrationHandsTheBufferBackOverBudget) {
  auto registry = make_registry(4 * page_size());
  auto buffer = OwnedBuffer::allocate(5 * page_size());
  std::byte* const address = buffer.data();
  auto result = registry.async_register_owned(std::move(buffer), Access::remote_read, asio::use_future).get();
  ASSERT_FALSE(result);
  const auto& failure = result.error();
  EXPECT_TRUE(failure.error.is(errc::budget_exceeded));
  ASSERT_TRUE(failure.error.budget.has_value());
  EXPECT_EQ(failure.error.budget->requested, 5 * page_size());
  EXPECT_EQ(failure.error.budget->registered, 0u);
  EXPECT_EQ(failure.error.budget->budget, 4 * page_size());
  EXPECT_EQ(failure.buffer.data(), address) << "the same buffer must come back";
  EXPECT_EQ(failure.buffer.size(), 5 * page_size());
  EXPECT_THROW((void)result.value(), std::system_error);
}

// registry.hpp promises the buffer back on failure, with one exception
// (registry_shutdown_test.cpp: a rollback the backend refuses): every other
// way a registration fails hands the same buffer back.
TEST_F(RegistryTest, EveryOtherFailedOwnedRegistrationHandsTheSameBufferBack) {
  auto registry = make_registry();
  auto expect_back = [](corma::OwnedResult result, const std::byte* address, errc code, const char* how) {
    ASSERT_FALSE(result) << how;
    EXPECT_TRUE(result.error().error.is(code)) << how << ": " << result.error().error.message();
    EXPECT_EQ(result.error().buffer.data(), address) << how << ": the same buffer must come back";
  };

  auto refused = OwnedBuffer::allocate(page_size());
  const std::byte* refused_at = refused.data();
  backend->set_faults(TestBackendFaults{.refuse_maps_in = refused.bytes()});
  expect_back(registry.async_register_owned(std::move(refused), Access::local, asio::use_future).get(), refused_at,
              errc::backend, "refused by the backend");
  backend->set_faults({});

  auto cancelled = OwnedBuffer::allocate(page_size());
  const std::byte* cancelled_at = cancelled.data();
  backend->hold_maps();
  asio::cancellation_signal cancel;
  auto pending = registry.async_register_owned(std::move(cancelled), Access::local,
                                               asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  ASSERT_TRUE(backend->wait_for_held_maps(1));
  cancel.emit(asio::cancellation_type::total);
  backend->release_maps();
  expect_back(pending.get(), cancelled_at, errc::cancelled, "cancelled");

  ASSERT_TRUE(registry.async_shutdown(std::chrono::seconds(5), asio::use_future).get());
  auto late = OwnedBuffer::allocate(page_size());
  const std::byte* late_at = late.data();
  expect_back(registry.async_register_owned(std::move(late), Access::local, asio::use_future).get(), late_at,
              errc::shutting_down, "at the closed gate");
  EXPECT_EQ(registry.stats().leaked_owned_buffers, 0u);
}

TEST_F(RegistryTest, OwnedRegistrationOwnsTheBufferUntilRelease) {
  auto registry = make_registry();
  auto buffer = OwnedBuffer::allocate(page_size());
  buffer.bytes()[0] = std::byte{7};
  auto result = registry.async_register_owned(std::move(buffer), Access::remote_read, asio::use_future).get();
  ASSERT_TRUE(result);
  RegionGuard guard = std::move(result).value();
  EXPECT_EQ(guard.bytes()[0], std::byte{7});
  auto event = guard.deregistered();
  guard = RegionGuard{};
  EXPECT_TRUE(wait_released(event));
  EXPECT_EQ(registry.stats().leaked_owned_buffers, 0u);
}

TEST_F(RegistryTest, DegenerateRangesAreOutOfRange) {
  auto registry = make_registry();
  std::vector<std::byte> memory(16);
  auto* near_top = reinterpret_cast<std::byte*>(std::numeric_limits<std::uintptr_t>::max() - 10);
  const std::span<std::byte> cases[] = {
      {static_cast<std::byte*>(nullptr), 16},
      {memory.data(), 0},
      {near_top, 100},
  };
  for (auto span : cases) {
    auto r = register_now(registry, span);
    ASSERT_FALSE(r);
    EXPECT_TRUE(r.error().is(errc::out_of_range)) << r.error().message();
  }
  EXPECT_EQ(registry.stats().refused_invalid, 3u);
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(RegistryTest, A4097ByteRegistrationChargesTwoPages) {
  auto registry = make_registry();
  auto buffer = OwnedBuffer::allocate(4 * page_size());  // page-aligned
  auto guard = register_now(registry, buffer.bytes().first(page_size() + 1));
  ASSERT_TRUE(guard);
  EXPECT_EQ(guard.value().size(), page_size() + 1);
  EXPECT_EQ(guard.value().charged_bytes(), 2 * page_size());
  EXPECT_EQ(registry.stats().registered_bytes, 2 * page_size());
  EXPECT_EQ(registry.charge_for(buffer.data() + 1, page_size()), 2 * page_size());
  EXPECT_EQ(registry.charge_for(buffer.data(), page_size()), page_size());
}

TEST_F(RegistryTest, UnconfirmedUnmapKeepsTheBudgetAndTheLatch) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = register_now(registry, memory).value();
  auto event = guard.deregistered();
  backend->set_faults(TestBackendFaults{.refuse_unmap = true});

  auto outcome = guard.async_deregister(asio::use_future).get();
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::shutting_down));
  EXPECT_EQ(registry.stats().registered_bytes, guard.charged_bytes());
  EXPECT_GT(guard.charged_bytes(), 0u);
  EXPECT_EQ(registry.stats().unconfirmed_unmaps, 1u);
  EXPECT_FALSE(event.is_set());
  EXPECT_EQ(backend->live_registrations(), 1u);

  // A retry once the backend cooperates confirms it.
  backend->set_faults(TestBackendFaults{});
  EXPECT_TRUE(guard.async_deregister(asio::use_future).get());
  EXPECT_TRUE(event.is_set());
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(RegistryTest, ARegistrationWaitsForAnUnmapAlreadyUnderWayInsteadOfBeingRefused) {
  auto registry = make_registry(4 * page_size());
  auto memory = OwnedBuffer::allocate(8 * page_size());
  auto first = register_now(registry, memory.bytes().first(4 * page_size())).value();
  auto released = first.deregistered();

  // The progress thread is busy, so the unmap of the dropped guard is still
  // queued behind it when the next registration asks for the same bytes.
  std::promise<void> busy;
  asio::post(backend->progress_executor(), [wait = busy.get_future().share()] { wait.wait(); });
  first = RegionGuard{};
  auto second = registry.async_register(memory.bytes().subspan(4 * page_size(), 4 * page_size()),
                                        Access::remote_read, asio::use_future);
  EXPECT_FALSE(released.is_set());
  busy.set_value();

  auto guard = second.get();
  ASSERT_TRUE(guard) << guard.error().message();
  EXPECT_TRUE(released.is_set());
  EXPECT_EQ(registry.stats().registered_bytes, 4 * page_size());

  // With nothing on its way back, a registration over the budget is still refused.
  auto over = register_now(registry, memory.bytes().first(page_size()));
  ASSERT_FALSE(over);
  EXPECT_TRUE(over.error().is(errc::budget_exceeded));
}

TEST_F(RegistryTest, DestroyingAGuardOnAThreadWithoutAnIoContextDeregisters) {
  auto registry = make_registry();
  std::vector<std::byte> memory(2 * page_size());
  auto guard = register_now(registry, memory).value();
  auto event = guard.deregistered();
  std::thread([g = std::move(guard)]() mutable { g = RegionGuard{}; }).join();
  EXPECT_TRUE(wait_released(event));
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  EXPECT_EQ(registry.stats().deregistrations, 1u);
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(RegistryTest, GuardOutlivesItsRegistry) {
  std::vector<std::byte> memory(page_size());
  RegionGuard guard;
  {
    auto registry = make_registry();
    guard = register_now(registry, memory).value();
  }
  auto event = guard.deregistered();
  guard = RegionGuard{};
  EXPECT_TRUE(wait_released(event));
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(RegistryTest, DeregisterWaitsForTransfersInFlight) {
  auto target = TestBackend::create();
  std::vector<std::byte> source(page_size(), std::byte{0x5A}), destination(page_size());
  auto remote_region = target->async_map(source.data(), source.size(), Access::remote_read,
                                         asio::use_future).get().value();
  auto offer = backend->async_peer_offer(asio::use_future).get().value();
  auto answer = target->async_peer_accept(offer.blob, asio::use_future).get().value();
  ASSERT_TRUE(backend->async_peer_complete(offer.peer, answer.blob, asio::use_future).get());

  auto registry = make_registry();
  auto guard = register_now(registry, destination, Access::local).value();
  const corma::RemoteRegion remote{corma::testing::test_backend_id, 1, remote_region.effective_addr, source.size(),
                                   remote_region.packed_key};
  backend->hold_transfers();
  std::vector<std::string> order;
  guard.async_get(offer.peer, remote, {0, 0, source.size()},
                  asio::bind_executor(io, [&](Result<void> r) {
                    EXPECT_TRUE(r);
                    order.push_back("get");
                  }));
  ASSERT_TRUE(backend->wait_for_transfers_in_flight(1));
  guard.async_deregister(asio::bind_executor(io, [&](Result<void> r) {
    EXPECT_TRUE(r);
    order.push_back("deregister");
  }));
  // New transfers are refused once deregistration has begun.
  auto refused = guard.async_get(offer.peer, remote, {0, 0, 8}, asio::use_future).get();
  EXPECT_TRUE(refused.error().is(errc::region_not_found));
  io.poll();
  EXPECT_TRUE(order.empty()) << "deregistration finished while a transfer was in flight";
  EXPECT_EQ(backend->live_registrations(), 1u);

  backend->release_transfers();
  while (order.size() < 2) ASSERT_GT(io.run_one_for(std::chrono::seconds(5)), 0u);
  EXPECT_EQ(order, (std::vector<std::string>{"get", "deregister"}));
  EXPECT_EQ(destination[100], std::byte{0x5A});
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(RegistryTest, TransfersAreBoundsCheckedAgainstBothRegions) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = register_now(registry, memory).value();
  const corma::RemoteRegion remote{corma::testing::test_backend_id, 1, 0x1000, 64, corma::PackedKey(40)};
  auto r = guard.async_get(corma::PeerId{1}, remote, {page_size() - 8, 0, 16}, asio::use_future).get();
  EXPECT_TRUE(r.error().is(errc::out_of_range));
  r = guard.async_get(corma::PeerId{1}, remote, {0, 60, 16}, asio::use_future).get();
  EXPECT_TRUE(r.error().is(errc::out_of_range));
  auto foreign = remote;
  foreign.backend = corma::BackendId{1};
  r = guard.async_get(corma::PeerId{1}, foreign, {0, 0, 16}, asio::use_future).get();
  EXPECT_TRUE(r.error().is(errc::invalid_key));
}

/// The threads of this process now.
std::size_t thread_count() {
  const std::filesystem::directory_iterator tasks("/proc/self/task");
  return static_cast<std::size_t>(std::distance(begin(tasks), end(tasks)));
}

TEST_F(RegistryTest, AnswersGivenAtOnceStartNoThread) {
  auto registry = make_registry(2 * page_size());
  auto memory = OwnedBuffer::allocate(4 * page_size());
  auto first_page = memory.bytes().first(page_size());
  auto released = register_now(registry, first_page).value();
  auto event = released.deregistered();
  released = RegionGuard{};
  ASSERT_TRUE(wait_released(event));
  const auto before = thread_count();

  // Every path that answers from the initiating function, from a coroutine
  // on this test's io_context (its own executor) ...
  auto early_answers = [&]() -> asio::awaitable<void> {
    auto refused = co_await registry.async_register(memory.bytes(), Access::local, asio::use_awaitable);
    EXPECT_TRUE(refused.error().is(errc::budget_exceeded));
    auto invalid = co_await registry.async_register(first_page.first(0), Access::local, asio::use_awaitable);
    EXPECT_TRUE(invalid.error().is(errc::out_of_range));
    EXPECT_TRUE(co_await event.async_wait(asio::use_awaitable));  // deregistered long ago
    auto empty_event = co_await RegionGuard{}.deregistered().async_wait(asio::use_awaitable);
    EXPECT_TRUE(empty_event.error().is(errc::region_not_found));
    RegionGuard empty;
    const corma::RemoteRegion remote{corma::testing::test_backend_id, 1, 0x1000, 64, corma::PackedKey(40)};
    auto no_region = co_await empty.async_get(corma::PeerId{1}, remote, {0, 0, 8}, asio::use_awaitable);
    EXPECT_TRUE(no_region.error().is(errc::region_not_found));
    auto guard = co_await registry.async_register(first_page, Access::local, asio::use_awaitable);
    auto outside = co_await guard.value().async_get(corma::PeerId{1}, remote, {0, 60, 16}, asio::use_awaitable);
    EXPECT_TRUE(outside.error().is(errc::out_of_range));
    auto none = co_await RegionGuard::async_get_batch(corma::PeerId{1}, {}, asio::use_awaitable);
    EXPECT_TRUE(none);
    auto batch = co_await backend->async_get_batch(corma::TransferBatch(corma::max_batch_size + 1), asio::use_awaitable);
    EXPECT_TRUE(batch.error().is(errc::out_of_range));
    guard = corma::fail(errc::cancelled, "let go");
    EXPECT_TRUE(co_await registry.async_shutdown(std::chrono::seconds(5), asio::use_awaitable));
    // Answered from what the first found.
    EXPECT_TRUE(co_await registry.async_shutdown(std::chrono::seconds(5), asio::use_awaitable));
    EXPECT_TRUE(co_await backend->async_shutdown(asio::use_awaitable));
    auto after = co_await backend->async_map(memory.data(), page_size(), Access::local, asio::use_awaitable);
    EXPECT_TRUE(after.error().is(errc::shutting_down));
  };
  auto done = asio::co_spawn(io, early_answers(), asio::use_future);
  io.run();
  done.get();
  // ... and with no executor of its own (use_future): its answer goes
  // through the backend's thread.
  auto refused = registry.async_register(memory.bytes(), Access::local, asio::use_future).get();
  EXPECT_TRUE(refused.error().is(errc::shutting_down));
  auto late = backend->async_unmap(corma::RegionId{1}, asio::use_future).get();
  EXPECT_TRUE(late.error().is(errc::shutting_down));
  // ... and plain callbacks (no executor at all) asking empty objects, with
  // no backend to answer through: answered on this thread, at once.
  const auto this_thread = std::this_thread::get_id();
  std::vector<std::pair<std::thread::id, bool>> callbacks;
  const auto record = [&](bool as_expected) { callbacks.emplace_back(std::this_thread::get_id(), as_expected); };
  RegionGuard{}.deregistered().async_wait([&](Result<void> r) { record(r.error().is(errc::region_not_found)); });
  const corma::RemoteRegion remote{corma::testing::test_backend_id, 1, 0x1000, 64, corma::PackedKey(40)};
  RegionGuard{}.async_get(corma::PeerId{1}, remote, {0, 0, 8},
                          [&](Result<void> r) { record(r.error().is(errc::region_not_found)); });
  corma::Arena{}.async_allocate(64, [&](Result<RegionGuard> r) { record(r.error().is(errc::region_not_found)); });
  RegionGuard::async_get_batch(corma::PeerId{1}, {},
                               [&](Result<corma::BatchOutcome> r) { record(r && r.value().size == 0); });
  ASSERT_EQ(callbacks.size(), 4u);
  for (const auto& [thread, as_expected] : callbacks) {
    EXPECT_EQ(thread, this_thread);
    EXPECT_TRUE(as_expected);
  }
  EXPECT_EQ(thread_count(), before) << "an early answer started a thread";
}

// A deferred operation is launched later, maybe after the object it came
// from has gone (a temporary) or moved: it must not need that object.

TEST_F(RegistryTest, ADeferredWaitLaunchedAfterItsEventIsGoneCompletes) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = register_now(registry, memory).value();
  auto wait = guard.deregistered().async_wait(asio::deferred);  // the event was a temporary
  guard = RegionGuard{};
  auto waited = std::move(wait)(asio::use_future);
  ASSERT_EQ(waited.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(waited.get());
}

TEST_F(RegistryTest, DeferredGuardOperationsLaunchedAfterTheGuardMovedActOnItsRegion) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  auto guard = std::make_unique<RegionGuard>(register_now(registry, memory).value());
  auto event = guard->deregistered();
  const corma::RemoteRegion remote{corma::testing::test_backend_id, 1, 0x1000, 64, corma::PackedKey(40)};
  auto get = guard->async_get(corma::PeerId{1}, remote, {page_size() - 8, 0, 16}, asio::deferred);
  auto deregister = guard->async_deregister(asio::deferred);
  RegionGuard moved = std::move(*guard);
  guard.reset();

  // Checked against the region it was made for, not refused as an empty guard.
  auto got = std::move(get)(asio::use_future).get();
  EXPECT_TRUE(got.error().is(errc::out_of_range)) << got.error().message();
  EXPECT_TRUE(std::move(deregister)(asio::use_future).get());
  EXPECT_TRUE(event.is_set());
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
}

TEST_F(RegistryTest, DeferredRegistryOperationsLaunchedAfterTheRegistryMovedComplete) {
  auto registry = std::make_unique<Registry>(make_registry());
  std::vector<std::byte> memory(page_size());
  auto registration = registry->async_register(memory, Access::remote_read, asio::deferred);
  auto shutdown = registry->async_shutdown(std::chrono::seconds(5), asio::deferred);
  Registry moved = std::move(*registry);
  registry.reset();

  auto guard = std::move(registration)(asio::use_future).get();
  ASSERT_TRUE(guard) << guard.error().message();
  EXPECT_TRUE(std::move(shutdown)(asio::use_future).get());
  EXPECT_TRUE(guard.value().deregistered().is_set());
  EXPECT_EQ(moved.stats().registered_bytes, 0u);
}

TEST_F(RegistryTest, StatsCountRegistrationsAndLatency) {
  auto registry = make_registry();
  std::vector<std::byte> memory(page_size());
  for (int i = 0; i < 5; ++i) {
    auto guard = register_now(registry, memory).value();
    EXPECT_TRUE(guard.async_deregister(asio::use_future).get());
  }
  const auto stats = registry.stats();
  EXPECT_EQ(stats.registrations, 5u);
  EXPECT_EQ(stats.deregistrations, 5u);
  EXPECT_EQ(stats.registration_latency.total(), 5u);
  EXPECT_GT(stats.registration_latency.sum.count(), 0);
  EXPECT_EQ(stats.budget_bytes, default_budget);
  EXPECT_GT(stats.registration_latency.quantile_upper_bound(0.5).count(), 0);
}

}  // namespace
