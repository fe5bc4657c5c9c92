// Arenas: slices of one registration, handed out without a backend call,
// bounded to their own bytes, kept out of the arena while a transfer uses
// them, and waited for with cancellation.
#include "support/registry_fixture.hpp"

#include <corma/arena.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <atomic>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::Arena;
using corma::ArenaConfig;
using corma::errc;
using corma::RegionGuard;
using corma::Result;
using corma::testing::page_size;
using corma::testing::RegistryTest;
using corma::testing::TestBackend;

class ArenaTest : public RegistryTest {
 protected:
  Arena make_arena(corma::Registry& registry, std::size_t bytes, ArenaConfig config = {}) {
    return registry.async_make_arena(bytes, config, asio::use_future).get().value();
  }

  /// A peer whose `source` this test's backend may read.
  struct Peer {
    std::shared_ptr<TestBackend> target = TestBackend::create();
    std::vector<std::byte> source;
    corma::PeerId id{};
    corma::RemoteRegion remote;
  };
  Peer connect_peer(std::size_t size, std::byte fill) {
    Peer peer;
    peer.source.assign(size, fill);
    auto region = peer.target->async_map(peer.source.data(), size, Access::remote_read, asio::use_future).get().value();
    auto offer = backend->async_peer_offer(asio::use_future).get().value();
    auto answer = peer.target->async_peer_accept(offer.blob, asio::use_future).get().value();
    EXPECT_TRUE(backend->async_peer_complete(offer.peer, answer.blob, asio::use_future).get());
    peer.id = offer.peer;
    peer.remote = corma::RemoteRegion{corma::testing::test_backend_id, 1, region.effective_addr, size,
                                      region.packed_key};
    return peer;
  }
};

TEST_F(ArenaTest, ChargesTheBudgetOnceAndHandsOutDisjointSlicesWithoutABackendCall) {
  auto registry = make_registry(1 << 20);
  auto arena = make_arena(registry, 5 * 65536);  // a chunk for each class below
  EXPECT_EQ(registry.stats().registered_bytes, 5u * 65536);
  EXPECT_EQ(registry.stats().registrations, 1u);
  const auto maps_before = backend->live_registrations();

  std::vector<RegionGuard> slices;
  std::set<std::byte*> starts;
  for (std::size_t size : {1, 100, 256, 257, 4096, 5000, 65536}) {
    auto slice = arena.allocate(size);
    ASSERT_TRUE(slice) << slice.error().message();
    EXPECT_EQ(slice.value().size(), size);
    EXPECT_EQ(slice.value().charged_bytes(), 0u);
    EXPECT_EQ(slice.value().id(), arena.backend_region().id);
    EXPECT_TRUE(starts.insert(slice.value().data()).second);
    std::fill_n(slice.value().data(), size, std::byte{static_cast<unsigned char>(size)});
    slices.push_back(std::move(slice).value());
  }
  // No two slices overlap: each still holds what was written into it.
  for (const auto& slice : slices) {
    for (std::byte b : slice.bytes()) ASSERT_EQ(b, std::byte{static_cast<unsigned char>(slice.size())});
  }
  EXPECT_EQ(backend->live_registrations(), maps_before) << "a slice went to the backend";
  EXPECT_EQ(registry.stats().registrations, 1u);
  EXPECT_EQ(arena.stats().slices, slices.size());
  // The registry reports its arenas' occupancy (for its metrics).
  EXPECT_EQ(registry.stats().arenas, 1u);
  EXPECT_EQ(registry.stats().arena_capacity_bytes, 5u * 65536);
  EXPECT_EQ(registry.stats().arena_slices, slices.size());
  EXPECT_EQ(registry.stats().arena_allocated_bytes, arena.stats().allocated_bytes);
  EXPECT_EQ(arena.stats().allocated_bytes, 256u * 3 + 512 + 4096 + 8192 + 65536);

  auto remote = slices[4].remote();
  EXPECT_EQ(remote.addr, reinterpret_cast<std::uint64_t>(slices[4].data()));
  EXPECT_EQ(remote.len, 4096u) << "a slice's remote() describes the slice only";
}

TEST_F(ArenaTest, RefusesWhatItCannotCutAndSaysWhenItIsFull) {
  auto registry = make_registry(64 * page_size());
  auto bad = registry.async_make_arena(65536, ArenaConfig{.min_slice = 300}, asio::use_future).get();
  EXPECT_TRUE(bad.error().is(errc::out_of_range));
  bad = registry.async_make_arena(0, ArenaConfig{}, asio::use_future).get();
  EXPECT_TRUE(bad.error().is(errc::out_of_range));
  bad = registry.async_make_arena(1 << 30, ArenaConfig{}, asio::use_future).get();
  EXPECT_TRUE(bad.error().is(errc::budget_exceeded)) << "an arena is charged like any registration";

  auto arena = make_arena(registry, 2 * 65536);
  EXPECT_TRUE(arena.allocate(0).error().is(errc::out_of_range));
  EXPECT_TRUE(arena.allocate(65537).error().is(errc::out_of_range));
  std::vector<RegionGuard> slices;
  for (int i = 0; i < 32; ++i) slices.push_back(arena.allocate(4096).value());  // two chunks of 16
  auto full = arena.allocate(4096);
  EXPECT_TRUE(full.error().is(errc::budget_exceeded)) << full.error().message();
  EXPECT_TRUE(arena.allocate(256).error().is(errc::budget_exceeded)) << "every chunk is cut for 4 KiB slices";
  EXPECT_EQ(arena.stats().refused, 2u);
  slices.pop_back();
  EXPECT_TRUE(arena.allocate(3000)) << "a slice given back is handed out again";
}

TEST_F(ArenaTest, TransfersStayInsideTheSliceAndKeepItOutOfTheArena) {
  auto peer = connect_peer(4096, std::byte{0x3C});
  auto registry = make_registry(64 * page_size());
  auto arena = make_arena(registry, 65536, ArenaConfig{.min_slice = 1024, .max_slice = 4096});
  auto first = arena.allocate(1024).value();
  auto slice = arena.allocate(1024).value();
  std::fill_n(first.data(), 1024, std::byte{0});
  std::fill_n(slice.data(), 1024, std::byte{0});

  auto outside = slice.async_get(peer.id, peer.remote, {1000, 0, 100}, asio::use_future).get();
  EXPECT_TRUE(outside.error().is(errc::out_of_range)) << "a slice's bytes end where the slice does";

  backend->hold_transfers();
  bool landed = false;
  slice.async_get(peer.id, peer.remote, {24, 0, 1000}, asio::bind_executor(io, [&](Result<void> r) {
    EXPECT_TRUE(r);
    landed = true;
  }));
  ASSERT_TRUE(backend->wait_for_transfers_in_flight(1));
  const auto at = slice.data();
  auto given_back = slice.deregistered();
  slice = RegionGuard{};
  EXPECT_FALSE(given_back.is_set()) << "a slice went back while a transfer into it ran";
  EXPECT_EQ(arena.stats().slices, 2u);
  backend->release_transfers();
  while (!landed) ASSERT_GT(io.run_one_for(std::chrono::seconds(5)), 0u);
  ASSERT_TRUE(wait_released(given_back));
  EXPECT_EQ(arena.stats().slices, 1u);
  EXPECT_EQ(at[24], std::byte{0x3C});
  EXPECT_EQ(at[23], std::byte{0});
  for (std::byte b : first.bytes()) ASSERT_EQ(b, std::byte{0}) << "a get into one slice wrote into another";
}

TEST_F(ArenaTest, AnOperationLaunchedAfterItsSliceWentBackIsRefused) {
  auto peer = connect_peer(64, std::byte{1});
  auto registry = make_registry(64 * page_size());
  auto arena = make_arena(registry, 65536);
  auto slice = arena.allocate(64).value();
  auto late = slice.async_get(peer.id, peer.remote, {0, 0, 64}, asio::deferred);
  auto gone = slice.async_deregister(asio::use_future).get();
  EXPECT_TRUE(gone);
  auto refused = std::move(late)(asio::use_future).get();
  EXPECT_TRUE(refused.error().is(errc::region_not_found)) << "a deferred get ran on a slice given back";
}

TEST_F(ArenaTest, WaitingForRoomIsServedWhenASliceComesBackAndCanBeCancelled) {
  auto registry = make_registry(64 * page_size());
  auto arena = make_arena(registry, 65536, ArenaConfig{.min_slice = 32768, .max_slice = 65536});
  auto a = arena.allocate(40000).value();  // the one chunk, cut for 64 KiB

  std::optional<Result<RegionGuard>> served, cancelled;
  asio::cancellation_signal signal;
  arena.async_allocate(50000, asio::bind_executor(io, [&](Result<RegionGuard> r) { served = std::move(r); }));
  arena.async_allocate(50000, asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<RegionGuard> r) {
                                                           cancelled = std::move(r);
                                                         })));
  io.poll();
  EXPECT_FALSE(served.has_value());
  EXPECT_EQ(arena.stats().waiting, 2u);
  signal.emit(asio::cancellation_type::terminal);
  while (!cancelled) ASSERT_GT(io.run_one_for(std::chrono::seconds(5)), 0u);
  EXPECT_TRUE(cancelled->error().is(errc::cancelled));
  EXPECT_EQ(arena.stats().waiting, 1u);

  a = RegionGuard{};
  while (!served) ASSERT_GT(io.run_one_for(std::chrono::seconds(5)), 0u);
  ASSERT_TRUE(*served) << served->error().message();
  EXPECT_EQ(served->value().size(), 50000u);
  EXPECT_EQ(arena.stats().waiting, 0u);
}

TEST_F(ArenaTest, DroppingTheArenaAnswersItsWaitersAndItsRegistrationOutlivesItsSlices) {
  auto registry = make_registry(64 * page_size());
  auto arena = make_arena(registry, 65536, ArenaConfig{.min_slice = 65536, .max_slice = 65536});
  auto slice = arena.allocate(10).value();
  std::optional<Result<RegionGuard>> waiting;
  arena.async_allocate(10, asio::bind_executor(io, [&](Result<RegionGuard> r) { waiting = std::move(r); }));
  arena = Arena{};
  while (!waiting) ASSERT_GT(io.run_one_for(std::chrono::seconds(5)), 0u);
  EXPECT_TRUE(waiting->error().is(errc::shutting_down));

  EXPECT_EQ(backend->live_registrations(), 1u) << "the arena's registration went with a slice still out";
  std::fill_n(slice.data(), 10, std::byte{9});
  auto event = slice.deregistered();
  slice = RegionGuard{};
  ASSERT_TRUE(wait_released(event));
  EXPECT_EQ(registry.stats().arenas, 0u) << "the arena's core outlived its last slice";
  EXPECT_EQ(registry.stats().arena_slices, 0u);
  ASSERT_TRUE(registry.async_shutdown(std::chrono::seconds(5), asio::use_future).get());
  EXPECT_EQ(backend->live_registrations(), 0u);
  EXPECT_EQ(registry.stats().registered_bytes, 0u);
}

TEST_F(ArenaTest, ASliceGoesBackExactlyOnceWhenItsGuardAndItsLastTransferEndTogether) {
  // The guard lets go on this thread while the transfer ends on the
  // progress thread: whichever is last gives the slice back, once.
  auto peer = connect_peer(64, std::byte{7});
  auto registry = make_registry(64 * page_size());
  auto arena = make_arena(registry, 65536, ArenaConfig{.min_slice = 64, .max_slice = 4096});
  constexpr int rounds = 500;
  std::vector<corma::DeregisteredEvent> returned;
  for (int i = 0; i < rounds; ++i) {
    auto slice = arena.allocate(64).value();
    slice.async_get(peer.id, peer.remote, {0, 0, 64}, [&](Result<void> r) {
      EXPECT_TRUE(r) << r.error().message();
    });
    returned.push_back(slice.deregistered());
  }
  for (auto& event : returned) ASSERT_TRUE(wait_released(event));
  EXPECT_EQ(arena.stats().slices, 0u) << "a slice went back twice, or never";
  EXPECT_EQ(arena.stats().allocated_bytes, 0u);
  EXPECT_EQ(registry.stats().arena_slices, 0u);
  // Every slice is free once, so the arena hands all of them out again.
  std::vector<RegionGuard> all;
  for (int i = 0; i < 65536 / 64; ++i) all.push_back(arena.allocate(64).value());
  EXPECT_FALSE(arena.allocate(64)) << "the arena has more slices than its bytes";
  std::set<std::byte*> distinct;
  for (const auto& slice : all) distinct.insert(slice.data());
  EXPECT_EQ(distinct.size(), all.size());
}

TEST_F(ArenaTest, ThreadsTakingAndGivingBackSlicesNeverShareBytes) {
  auto registry = make_registry(1 << 20);
  auto arena = make_arena(registry, 4 * 65536, ArenaConfig{.min_slice = 256, .max_slice = 65536});
  std::atomic<bool> overlap{false};
  std::atomic<std::uint64_t> refused{0};
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<RegionGuard> held;
    for (int i = 0; i < 2000; ++i) {
      const std::size_t size = 1 + rng() % 4096;
      auto slice = arena.allocate(size);
      if (!slice) {
        ++refused;
      } else {
        // Stamp it, and check the stamp is still whole when it goes back.
        std::fill_n(slice.value().data(), size, std::byte{static_cast<unsigned char>(seed)});
        held.push_back(std::move(slice).value());
      }
      if (held.size() > 8 || (!held.empty() && rng() % 2 == 0)) {
        const auto& last = held.back();
        for (std::byte b : last.bytes()) {
          if (b != std::byte{static_cast<unsigned char>(seed)}) overlap = true;
        }
        held.pop_back();
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t <= 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_FALSE(overlap) << "two threads held the same bytes";
  EXPECT_EQ(arena.stats().slices, 0u);
  EXPECT_EQ(arena.stats().allocated_bytes, 0u);
}

}  // namespace
