// The registration cache: registrations of covered bytes share a cached
// registration; idle ones stay within their share of the budget, least
// recently used first out, and make room when the budget needs it; guards
// exposed to peers share only registrations of exactly their bytes;
// invalidation, explicit deregistration and shutdown end caching.
#include "support/registry_fixture.hpp"

#include <atomic>
#include <future>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::errc;
using corma::OwnedBuffer;
using corma::RegionGuard;
using corma::Registry;
using corma::RegistryConfig;
using corma::testing::page_size;
using corma::testing::RegistryTest;

class RegistrationCacheTest : public RegistryTest {
 protected:
  Registry make_cached(std::size_t budget_pages, double idle_share = 0.25, bool share_exposed = false) {
    RegistryConfig config{budget_pages * page_size(), 0};
    config.cache_registrations = true;
    config.cache_idle_share = idle_share;
    config.share_exposed_registrations = share_exposed;
    return Registry(backend, config);
  }
  OwnedBuffer memory = OwnedBuffer::allocate(32 * page_size());
  std::span<std::byte> pages(std::size_t first, std::size_t count) {
    return memory.bytes().subspan(first * page_size(), count * page_size());
  }
};

TEST_F(RegistrationCacheTest, BytesInsideACachedRegistrationShareItWithoutABackendCallOrACharge) {
  auto registry = make_cached(16);
  auto whole = register_now(registry, pages(0, 2), Access::local).value();
  EXPECT_EQ(registry.stats().registrations, 1u);
  auto inside = register_now(registry, pages(0, 2).subspan(100, 300), Access::local);
  ASSERT_TRUE(inside) << inside.error().message();
  EXPECT_EQ(inside.value().data(), memory.data() + 100);
  EXPECT_EQ(inside.value().size(), 300u);
  EXPECT_EQ(inside.value().id(), whole.id()) << "not the same registration";
  EXPECT_EQ(registry.stats().registrations, 1u);
  EXPECT_EQ(backend->live_registrations(), 1u);
  EXPECT_EQ(registry.stats().registered_bytes, 2 * page_size()) << "charged twice";
  EXPECT_EQ(registry.stats().cache_hits, 1u);

  // A small local registration covers its whole page: a neighbour shares it.
  auto small = register_now(registry, pages(4, 1).subspan(10, 20), Access::local).value();
  auto neighbour = register_now(registry, pages(4, 1).subspan(2000, 100), Access::local).value();
  EXPECT_EQ(small.id(), neighbour.id());
  EXPECT_EQ(registry.stats().registrations, 2u);
}

TEST_F(RegistrationCacheTest, ARegistrationWithNoGuardLeftStaysCachedAndIsSharedAgain) {
  auto registry = make_cached(16);
  auto first = register_now(registry, pages(0, 1), Access::local).value();
  auto event = first.deregistered();
  first = RegionGuard{};
  EXPECT_EQ(backend->live_registrations(), 1u) << "an idle cached registration went";
  EXPECT_EQ(registry.stats().cache_idle_bytes, page_size());
  EXPECT_FALSE(event.is_set()) << "its memory is still registered";
  auto again = register_now(registry, pages(0, 1), Access::local).value();
  EXPECT_EQ(registry.stats().registrations, 1u);
  EXPECT_EQ(registry.stats().cache_idle_bytes, 0u);
}

TEST_F(RegistrationCacheTest, IdleRegistrationsBeyondTheirShareGoLeastRecentlyUsedFirst) {
  auto registry = make_cached(16, 0.25);  // four idle pages
  std::vector<RegionGuard> guards;
  std::vector<corma::DeregisteredEvent> events;
  for (std::size_t i = 0; i < 6; ++i) {
    guards.push_back(register_now(registry, pages(2 * i, 1), Access::local).value());
    events.push_back(guards.back().deregistered());
  }
  guards.clear();  // returned oldest first
  ASSERT_TRUE(wait_released(events[0]));
  ASSERT_TRUE(wait_released(events[1]));
  for (std::size_t i = 2; i < 6; ++i) EXPECT_FALSE(events[i].is_set()) << i;
  EXPECT_EQ(registry.stats().cache_evictions, 2u);
  EXPECT_EQ(registry.stats().cache_idle_bytes, 4 * page_size());
}

TEST_F(RegistrationCacheTest, TheBudgetTakesIdleRegistrationsBackBeforeItRefuses) {
  auto registry = make_cached(4, 1.0);
  std::vector<corma::DeregisteredEvent> events;
  for (std::size_t i = 0; i < 4; ++i) {
    auto guard = register_now(registry, pages(2 * i, 1), Access::local).value();
    events.push_back(guard.deregistered());
  }
  EXPECT_EQ(registry.stats().cache_idle_bytes, 4 * page_size());
  auto fresh = register_now(registry, pages(20, 2), Access::local);
  ASSERT_TRUE(fresh) << fresh.error().message();
  EXPECT_TRUE(events[0].is_set() && events[1].is_set()) << "the least recently used make room";
  EXPECT_FALSE(events[2].is_set() || events[3].is_set()) << "more went than the room needed";
  EXPECT_LE(registry.stats().registered_bytes, 4 * page_size());
  // Nothing idle left to take: refused as before.
  auto held = register_now(registry, pages(24, 2), Access::local).value();
  auto refused = register_now(registry, pages(28, 1), Access::local);
  EXPECT_TRUE(refused.error().is(errc::budget_exceeded));
}

TEST_F(RegistrationCacheTest, KeptRegistrationsAreCachedWithTheCacheOffAndOutliveTheIdleShare) {
  Registry registry(backend, RegistryConfig{16 * page_size(), 0});  // cache_registrations off
  const corma::RegistrationOptions keep{corma::Caching::keep, nullptr, nullptr};
  auto kept = registry.async_register(pages(0, 2), Access::remote_read, keep, asio::use_future).get().value();
  const auto id = kept.id();
  kept = RegionGuard{};
  EXPECT_EQ(registry.stats().cache_idle_bytes, 2 * page_size()) << "a kept one outlives the idle share (0 here)";
  EXPECT_EQ(backend->live_registrations(), 1u);

  auto found = registry.find_cached(pages(0, 2), Access::remote_read);
  ASSERT_TRUE(found) << found.error().message();
  EXPECT_EQ(found.value().id(), id);
  EXPECT_EQ(registry.stats().cache_misses, 1u) << "the look-up that found it counted no miss";
  EXPECT_TRUE(registry.find_cached(pages(8, 1), Access::local).error().is(errc::region_not_found));
  EXPECT_EQ(registry.stats().cache_misses, 1u) << "a look-up that finds nothing is no miss";

  // Without asking, a registration neither shares the cache nor joins it.
  auto plain = register_now(registry, pages(0, 2)).value();
  EXPECT_NE(plain.id(), id);
  auto plain_event = plain.deregistered();
  plain = RegionGuard{};
  ASSERT_TRUE(wait_released(plain_event)) << "a plain registration was kept idle";
  EXPECT_EQ(registry.stats().cache_idle_bytes, 0u) << "found holds the kept one";
  EXPECT_EQ(backend->live_registrations(), 1u);
}

TEST_F(RegistrationCacheTest, CachingNeverRegistersAnewWithTheCacheOn) {
  auto registry = make_cached(16);
  auto cached = register_now(registry, pages(0, 1), Access::local).value();
  const corma::RegistrationOptions never{corma::Caching::never, nullptr, nullptr};
  auto apart = registry.async_register(pages(0, 1), Access::local, never, asio::use_future).get().value();
  EXPECT_NE(apart.id(), cached.id());
  auto event = apart.deregistered();
  apart = RegionGuard{};
  ASSERT_TRUE(wait_released(event)) << "not kept idle";
  EXPECT_EQ(registry.stats().cache_hits, 0u);
}

TEST_F(RegistrationCacheTest, AKeptRegistrationHoldsItsKeepaliveUntilReleasedAndReportsItsEviction) {
  Registry registry(backend, RegistryConfig{4 * page_size(), 0});
  std::promise<void> let_go;
  auto freed = let_go.get_future();
  std::weak_ptr<const void> watched;
  std::atomic<int> evicted{0};
  std::optional<corma::DeregisteredEvent> event;
  {
    auto keepalive = std::shared_ptr<const void>(new int(0), [&let_go](const void* p) {
      delete static_cast<const int*>(p);
      let_go.set_value();
    });
    watched = keepalive;
    corma::RegistrationOptions keep{corma::Caching::keep, std::move(keepalive), [&evicted] { ++evicted; }};
    auto kept = registry.async_register(pages(0, 3), Access::remote_read, std::move(keep), asio::use_future).get();
    event.emplace(kept.value().deregistered());
  }
  EXPECT_FALSE(watched.expired()) << "the bytes of an idle cached registration were let go";

  // Invalidation is not eviction.
  auto other = registry.async_register(pages(8, 1), Access::remote_read,
                                       corma::RegistrationOptions{corma::Caching::keep, nullptr, [&evicted] {
                                                                    evicted += 100;
                                                                  }},
                                       asio::use_future).get().value();
  other = RegionGuard{};
  ASSERT_TRUE(registry.async_invalidate(pages(8, 1), asio::use_future).get());
  EXPECT_EQ(evicted.load(), 0);

  // The budget needs the room: evicted, then its bytes let go.
  auto fresh = register_now(registry, pages(16, 2));
  ASSERT_TRUE(fresh) << fresh.error().message();
  EXPECT_EQ(evicted.load(), 1);
  EXPECT_EQ(registry.stats().cache_evictions, 1u);
  ASSERT_TRUE(wait_released(*event));
  ASSERT_EQ(freed.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "the keepalive was kept";
}

TEST_F(RegistrationCacheTest, AGuardExposedToPeersSharesOnlyARegistrationOfExactlyItsBytes) {
  auto registry = make_cached(16);
  auto object = register_now(registry, pages(0, 2), Access::remote_read).value();
  auto part = register_now(registry, pages(0, 1), Access::remote_read).value();
  EXPECT_NE(part.id(), object.id()) << "a peer holding part's key could read all of object";
  EXPECT_EQ(part.remote().len, page_size());
  auto same = register_now(registry, pages(0, 2), Access::remote_read).value();
  EXPECT_EQ(same.id(), object.id()) << "exactly the same bytes share";
  auto local = register_now(registry, pages(0, 2).subspan(5, 50), Access::local).value();
  EXPECT_TRUE(local.id() == object.id() || local.id() == part.id()) << "a local guard shares a wider one";
  auto wider_access = register_now(registry, pages(0, 2), Access::remote_read_write).value();
  EXPECT_NE(wider_access.id(), object.id()) << "a read-only registration served a writable guard";

  auto trusting = make_cached(16, 0.25, true);
  auto exposed = register_now(trusting, pages(8, 2), Access::remote_read).value();
  auto inside = register_now(trusting, pages(8, 1), Access::remote_read).value();
  EXPECT_EQ(inside.id(), exposed.id()) << "exposed sharing was asked for";
  EXPECT_EQ(inside.remote().len, page_size()) << "remote() still names the guard's bytes only";
}

TEST_F(RegistrationCacheTest, InvalidationEndsCachingAndCompletesOnceTheMemoryIsReleased) {
  auto registry = make_cached(16);
  auto idle = register_now(registry, pages(0, 1), Access::local).value();
  auto idle_event = idle.deregistered();
  idle = RegionGuard{};
  auto live = register_now(registry, pages(4, 1), Access::local).value();
  auto live_event = live.deregistered();

  auto invalidated = registry.async_invalidate(pages(0, 8), asio::use_future);
  ASSERT_TRUE(wait_released(idle_event)) << "the idle one goes at once";
  EXPECT_FALSE(live_event.is_set()) << "the live one waits for its guard";
  EXPECT_EQ(invalidated.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  EXPECT_EQ(backend->live_registrations(), 1u);
  auto after = register_now(registry, pages(4, 1), Access::local).value();
  EXPECT_NE(after.id(), live.id()) << "an invalidated registration was shared";
  live = RegionGuard{};
  ASSERT_TRUE(invalidated.get());
  EXPECT_TRUE(live_event.is_set());
  auto nothing = registry.async_invalidate(pages(16, 4), asio::use_future).get();
  EXPECT_TRUE(nothing);
}

TEST_F(RegistrationCacheTest, ExplicitDeregistrationIsNotKeptIdle) {
  auto registry = make_cached(16);
  auto a = register_now(registry, pages(0, 1), Access::local).value();
  auto b = register_now(registry, pages(0, 1).subspan(0, 64), Access::local).value();
  auto done = a.async_deregister(asio::use_future);
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout) << "b still holds it";
  b = RegionGuard{};
  ASSERT_TRUE(done.get());
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().cache_idle_bytes, 0u);
}

TEST_F(RegistrationCacheTest, ShutdownReleasesIdleAndLiveCachedRegistrations) {
  auto registry = make_cached(16);
  auto idle = register_now(registry, pages(0, 1), Access::local).value();
  idle = RegionGuard{};
  auto live = register_now(registry, pages(4, 1), Access::local).value();
  auto event = live.deregistered();
  ASSERT_TRUE(registry.async_shutdown(std::chrono::seconds(5), asio::use_future).get());
  EXPECT_TRUE(event.is_set());
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
  EXPECT_TRUE(register_now(registry, pages(4, 1), Access::local).error().is(errc::shutting_down));
  live = RegionGuard{};
}

TEST_F(RegistrationCacheTest, ARegistryDestroyedWithIdleEntriesDeregistersThem) {
  std::vector<corma::DeregisteredEvent> events;
  {
    auto registry = make_cached(16);
    auto guard = register_now(registry, pages(0, 1), Access::local).value();
    events.push_back(guard.deregistered());
  }
  ASSERT_TRUE(wait_released(events[0]));
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(RegistrationCacheTest, ThreadsRegisteringOverlappingBytesNeverOvershootAndLeaveNothingBehind) {
  auto registry = make_cached(8, 0.5);
  std::atomic<bool> overshoot{false};
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<RegionGuard> held;
    for (int i = 0; i < 300; ++i) {
      const std::size_t first = rng() % 30;
      const auto range = pages(first, 1 + rng() % 2).subspan(rng() % 100, 200);
      auto guard = register_now(registry, range, Access::local);
      if (guard) {
        EXPECT_EQ(guard.value().data(), range.data());
        held.push_back(std::move(guard).value());
      } else {
        EXPECT_TRUE(guard.error().is(errc::budget_exceeded)) << guard.error().message();
      }
      if (registry.stats().registered_bytes > 8 * page_size()) overshoot = true;
      if (held.size() > 2 || rng() % 2 == 0) held.clear();
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t <= 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_FALSE(overshoot);
  EXPECT_GT(registry.stats().cache_hits, 0u);
  ASSERT_TRUE(registry.async_shutdown(std::chrono::seconds(5), asio::use_future).get());
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
}

}  // namespace
