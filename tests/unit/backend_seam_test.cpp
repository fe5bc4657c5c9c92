// The RdmaBackend seam with every kind of completion token, exercised
// through the in-process test backend.
#include "support/run.hpp"
#include "support/test_backend.hpp"

#include <corma/backend.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <future>
#include <numeric>
#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::BackendRegion;
using corma::errc;
using corma::Result;
using corma::testing::TestBackend;

class BackendSeam : public ::testing::Test {
 protected:
  std::shared_ptr<TestBackend> backend = TestBackend::create();
  std::vector<std::byte> memory = std::vector<std::byte>(8192);
  asio::io_context io;
};

TEST_F(BackendSeam, UseAwaitableMapsAndUnmaps) {
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto region = co_await backend->async_map(memory.data(), memory.size(), Access::remote_read,
                                              asio::use_awaitable);
    EXPECT_TRUE(region);
    EXPECT_EQ(region.value().effective_addr, reinterpret_cast<std::uint64_t>(memory.data()));
    EXPECT_EQ(region.value().effective_len, memory.size());
    EXPECT_FALSE(region.value().packed_key.empty());
    EXPECT_EQ(backend->live_registrations(), 1u);
    auto unmapped = co_await backend->async_unmap(region.value().id, asio::use_awaitable);
    EXPECT_TRUE(unmapped);
    EXPECT_EQ(backend->live_registrations(), 0u);
  }());
}

TEST_F(BackendSeam, PlainCallback) {
  std::promise<Result<BackendRegion>> done;
  backend->async_map(memory.data(), memory.size(), Access::local,
                     [&](Result<BackendRegion> r) { done.set_value(std::move(r)); });
  auto region = done.get_future().get();
  ASSERT_TRUE(region);
  EXPECT_EQ(backend->live_registrations(), 1u);
  std::promise<Result<void>> unmapped;
  backend->async_unmap(region.value().id, [&](Result<void> r) { unmapped.set_value(r); });
  EXPECT_TRUE(unmapped.get_future().get());
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(BackendSeam, DeferredStartsOnlyWhenInvoked) {
  auto op = backend->async_map(memory.data(), memory.size(), Access::local, asio::deferred);
  EXPECT_EQ(backend->live_registrations(), 0u);  // nothing happened yet
  auto region = corma::testing::run(io, std::move(op)(asio::use_awaitable));
  ASSERT_TRUE(region);
  EXPECT_EQ(backend->live_registrations(), 1u);
}

TEST_F(BackendSeam, UseFuture) {
  auto future = backend->async_map(memory.data(), memory.size(), Access::local, asio::use_future);
  auto region = future.get();
  ASSERT_TRUE(region);
  auto unmapped = backend->async_unmap(region.value().id, asio::use_future).get();
  EXPECT_TRUE(unmapped);
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(BackendSeam, BoundCancellationSlotCancelsAHeldMap) {
  backend->hold_maps();
  asio::cancellation_signal signal;
  std::optional<Result<BackendRegion>> outcome;
  backend->async_map(memory.data(), memory.size(), Access::local,
                     asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<BackendRegion> r) {
                                                    outcome = std::move(r);
                                                  })));
  ASSERT_TRUE(backend->wait_for_held_maps(1));
  signal.emit(asio::cancellation_type::terminal);
  io.run_for(std::chrono::seconds(10));
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(*outcome);
  EXPECT_TRUE(outcome->error().is(errc::cancelled));
  EXPECT_EQ(backend->live_registrations(), 0u);
  backend->release_maps();
}

TEST_F(BackendSeam, NeverCompletesInsideTheInitiatingCall) {
  bool initiated = false;
  bool completed_early = true;
  asio::post(io, [&] {
    // A refusal known at once still arrives later, through the executor.
    backend->async_map(nullptr, 0, Access::local, asio::bind_executor(io, [&](Result<BackendRegion> r) {
                         completed_early = !initiated;
                         EXPECT_TRUE(r.error().is(errc::out_of_range));
                       }));
    initiated = true;
  });
  io.run_for(std::chrono::seconds(10));
  EXPECT_TRUE(initiated);
  EXPECT_FALSE(completed_early);
}

TEST_F(BackendSeam, CancellingAMapThatAlreadyMappedRollsItBack) {
  backend->set_faults(corma::testing::TestBackendFaults{.map_delay = std::chrono::seconds(30)});
  asio::cancellation_signal signal;
  std::optional<Result<BackendRegion>> outcome;
  backend->async_map(memory.data(), memory.size(), Access::local,
                     asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<BackendRegion> r) {
                                                    outcome = std::move(r);
                                                  })));
  ASSERT_TRUE(backend->wait_for_live(1));  // registered, not yet answered
  signal.emit(asio::cancellation_type::terminal);
  io.run_for(std::chrono::seconds(10));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(outcome->error().is(errc::cancelled));
  EXPECT_EQ(backend->live_registrations(), 0u);
}

TEST_F(BackendSeam, MapWhoseHandlerIsDestroyedUndeliveredIsRolledBack) {
  {
    asio::io_context never_run;
    backend->async_map(memory.data(), memory.size(), Access::local,
                       asio::bind_executor(never_run, [](Result<BackendRegion>) {
                         ADD_FAILURE() << "the handler was not supposed to run";
                       }));
    ASSERT_TRUE(backend->wait_for_maps_handed_off(1));
    EXPECT_EQ(backend->live_registrations(), 1u);
  }  // destroying the io_context destroys the undelivered handler
  EXPECT_TRUE(backend->wait_for_live(0));
}

// Two backends connected by offer / accept / complete, as two processes would be.
struct Pair {
  std::shared_ptr<TestBackend> initiator = TestBackend::create();
  std::shared_ptr<TestBackend> target = TestBackend::create();
  corma::PeerId peer{};  // the initiator's name for the target

  asio::awaitable<void> connect() {
    auto offer = co_await initiator->async_peer_offer(asio::use_awaitable);
    EXPECT_TRUE(offer);
    auto answer = co_await target->async_peer_accept(offer.value().blob, asio::use_awaitable);
    EXPECT_TRUE(answer);
    auto done = co_await initiator->async_peer_complete(offer.value().peer, answer.value().blob,
                                                        asio::use_awaitable);
    EXPECT_TRUE(done);
    peer = offer.value().peer;
  }

  struct Regions {
    corma::BackendRegion remote;  ///< `source`, exported by the target
    corma::BackendRegion local;   ///< `destination`, on the initiator
  };

  /// Connects, then maps `source` on the target (read-only for peers) and
  /// `destination` on the initiator.
  asio::awaitable<Regions> connect_and_map(std::vector<std::byte>& source, std::vector<std::byte>& destination) {
    co_await connect();
    auto remote = co_await target->async_map(source.data(), source.size(), Access::remote_read, asio::use_awaitable);
    auto local = co_await initiator->async_map(destination.data(), destination.size(), Access::local,
                                               asio::use_awaitable);
    co_return Regions{std::move(remote).value(), std::move(local).value()};
  }
};

TEST(BackendTransfers, GetAndPutMoveTheBytes) {
  asio::io_context io;
  Pair pair;
  std::vector<std::byte> source(4096), destination(4096);
  std::iota(reinterpret_cast<unsigned char*>(source.data()),
            reinterpret_cast<unsigned char*>(source.data() + source.size()), 0);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    co_await pair.connect();
    auto remote = co_await pair.target->async_map(source.data(), source.size(),
                                                  Access::remote_read_write, asio::use_awaitable);
    auto local = co_await pair.initiator->async_map(destination.data(), destination.size(),
                                                    Access::local, asio::use_awaitable);
    EXPECT_TRUE(remote && local);
    // Named, not a braced temporary: g++ 12 destroys aggregate temporaries
    // inside a co_await expression twice.
    corma::GetRequest get{pair.peer, local.value().id, 16, remote.value().effective_addr + 100, 1000,
                          remote.value().packed_key};
    auto got = co_await pair.initiator->async_get(std::move(get), asio::use_awaitable);
    EXPECT_TRUE(got);
    EXPECT_EQ(std::memcmp(destination.data() + 16, source.data() + 100, 1000), 0);

    destination[0] = std::byte{0xAB};
    corma::PutRequest put_request{pair.peer, local.value().id, 0, remote.value().effective_addr + 4000, 1,
                                  remote.value().packed_key};
    auto put = co_await pair.initiator->async_put(std::move(put_request), asio::use_awaitable);
    EXPECT_TRUE(put);
    EXPECT_EQ(source[4000], std::byte{0xAB});
  }());
}

TEST(BackendTransfers, BadRequestsAreRefusedBeforeTheProvider) {
  asio::io_context io;
  Pair pair;
  std::vector<std::byte> source(4096), destination(4096);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [remote, local] = co_await pair.connect_and_map(source, destination);
    auto get = [&](corma::GetRequest r) { return pair.initiator->async_get(std::move(r), asio::use_awaitable); };
    const corma::GetRequest good{pair.peer, local.id, 0, remote.effective_addr, 64, remote.packed_key};

    auto r = good;
    r.len = 0;
    EXPECT_TRUE((co_await get(r)).error().is(errc::out_of_range));
    r = good;
    r.local_offset = ~std::uint64_t{0} - 10;
    EXPECT_TRUE((co_await get(r)).error().is(errc::out_of_range));
    r = good;
    r.remote_addr = remote.effective_addr + 4090;
    EXPECT_TRUE((co_await get(r)).error().is(errc::out_of_range));
    r = good;
    r.local = corma::RegionId{999999};
    EXPECT_TRUE((co_await get(r)).error().is(errc::region_not_found));
    r = good;
    r.peer = corma::PeerId{999999};
    EXPECT_TRUE((co_await get(r)).error().is(errc::peer_unreachable));
    r = good;
    std::get<corma::PackedKey>(r.key).clear();
    EXPECT_TRUE((co_await get(r)).error().is(errc::invalid_key));
    r = good;
    std::get<corma::PackedKey>(r.key).resize(3);
    EXPECT_TRUE((co_await get(r)).error().is(errc::invalid_key));
    r = good;
    std::get<corma::PackedKey>(r.key)[0] ^= std::byte{0xFF};
    EXPECT_TRUE((co_await get(r)).error().is(errc::invalid_key));
    // A put through a key to memory exported read-only is refused here.
    auto put = co_await pair.initiator->async_put(good, asio::use_awaitable);
    EXPECT_TRUE(put.error().is(errc::not_owned)) << put.error().message();
    EXPECT_TRUE(co_await get(good));
  }());
}

TEST(BackendTransfers, InjectedFailureFailsTheTransfer) {
  asio::io_context io;
  Pair pair;
  std::vector<std::byte> source(4096), destination(4096);
  pair.initiator->set_faults(corma::testing::TestBackendFaults{.fail_transfers = true});
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [remote, local] = co_await pair.connect_and_map(source, destination);
    corma::GetRequest request{pair.peer, local.id, 0, remote.effective_addr, 64, remote.packed_key};
    auto got = co_await pair.initiator->async_get(std::move(request), asio::use_awaitable);
    EXPECT_TRUE(got.error().is(errc::backend));
    EXPECT_EQ(pair.initiator->transfers_in_flight(), 0u);
  }());
}

TEST(BackendTransfers, CancelledGetAnswersEarlyAndKeepsTheRegionUntilItEnds) {
  asio::io_context io;
  Pair pair;
  std::vector<std::byte> source(4096), destination(4096);
  pair.initiator->hold_transfers();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto [remote, local] = co_await pair.connect_and_map(source, destination);
    asio::cancellation_signal signal;
    std::optional<Result<void>> got;
    pair.initiator->async_get(
        corma::GetRequest{pair.peer, local.id, 0, remote.effective_addr, 64, remote.packed_key},
        asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<void> r) { got = r; })));
    EXPECT_TRUE(pair.initiator->wait_for_transfers_in_flight(1));
    signal.emit(asio::cancellation_type::terminal);
    // The unmap must wait for the transfer that is still running.
    auto unmapped = pair.initiator->async_unmap(local.id, asio::use_future);
    while (!got) co_await asio::post(io, asio::use_awaitable);
    EXPECT_TRUE(got->error().is(errc::cancelled));
    EXPECT_EQ(pair.initiator->live_registrations(), 1u);
    EXPECT_EQ(pair.initiator->transfers_in_flight(), 1u);
    pair.initiator->release_transfers();
    EXPECT_TRUE(unmapped.get());
    EXPECT_EQ(pair.initiator->transfers_in_flight(), 0u);
    EXPECT_EQ(pair.initiator->live_registrations(), 0u);
  }());
}

}  // namespace
