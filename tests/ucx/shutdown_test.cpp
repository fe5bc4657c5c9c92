// Shutting down UCX backends and the registries over them.
//
// A reader and the backend it reads from, shutting down together: the
// target serves the reader's gets still in flight before it goes (UCX over
// shared memory and tcp serves a get on the target's progress thread), so
// they complete, and neither shutdown waits out its timeout. Before, the
// target went at once: over shared memory the reader then waited its whole
// shutdown timeout for gets nobody would serve, over tcp they failed.
//
// A reader over shared memory whose owner died: its get is stranded (UCX
// cannot end it), its region stays registered until the reader's backend
// shuts down, so the registry cannot go first on its own
// (docs/architecture.md, "Shutting down a registry and its backend").
//
// A backend whose last reference goes in a completion on its own progress
// thread: that thread tears down alone, and the process waits for it before
// its static destructors (returning from main under that teardown crashed
// in the provider's library destructors).
#include "ucx/settings.hpp"

#include "backend_kit/handed_over_threads.hpp"

#include <corma/registry.hpp>
#include <corma/ucx.hpp>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::testing::make_ucx;
using corma::testing::UcxSetting;

class UcxShutdownTogether : public ::testing::TestWithParam<UcxSetting> {};

TEST_P(UcxShutdownTogether, TheReadersGetsCompleteAndNeitherWaitsOutItsTimeout) {
  constexpr std::size_t gets = 16;
  constexpr std::size_t slice = 1 << 20;
  auto config = GetParam().config;
  config.shutdown_timeout = std::chrono::seconds(5);  // the default, spelled out
  auto reader = make_ucx(config);
  auto owner = make_ucx(config);
  auto offer = reader->async_peer_offer(asio::use_future).get().value();
  auto answer = owner->async_peer_accept(offer.blob, asio::use_future).get().value();
  ASSERT_TRUE(reader->async_peer_complete(offer.peer, answer.blob, asio::use_future).get());
  std::vector<std::byte> source(gets * slice);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + 3);
  std::vector<std::byte> landing(source.size());
  auto exported = owner->async_map(source.data(), source.size(), Access::remote_read, asio::use_future).get();
  ASSERT_TRUE(exported) << exported.error().message();
  auto local = reader->async_map(landing.data(), landing.size(), Access::local, asio::use_future).get();
  ASSERT_TRUE(local) << local.error().message();
  auto request = [&](std::size_t i, std::uint64_t len) {
    return corma::GetRequest{offer.peer, local.value().id, i * slice,
                             reinterpret_cast<std::uint64_t>(source.data()) + i * slice, len,
                             exported.value().packed_key};
  };
  // The endpoint is wired up first: what is under test is gets in flight.
  ASSERT_TRUE(reader->async_get(request(0, 64), asio::use_future).get());

  std::vector<std::future<corma::Result<void>>> pending;
  for (std::size_t i = 0; i < gets; ++i) pending.push_back(reader->async_get(request(i, slice), asio::use_future));
  const auto start = std::chrono::steady_clock::now();
  auto reader_down = reader->async_shutdown(asio::use_future);
  auto owner_down = owner->async_shutdown(asio::use_future);
  ASSERT_EQ(reader_down.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(owner_down.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(reader_down.get());
  EXPECT_TRUE(owner_down.get());
  for (std::size_t i = 0; i < gets; ++i) {
    auto got = pending[i].get();
    EXPECT_TRUE(got) << "get " << i << ": " << got.error().message();
  }
  EXPECT_EQ(std::memcmp(landing.data(), source.data(), source.size()), 0);
  EXPECT_LT(took, std::chrono::seconds(2)) << "a shutdown waited out its timeout";
}

INSTANTIATE_TEST_SUITE_P(Ucx, UcxShutdownTogether, ::testing::ValuesIn(corma::testing::ucx_peer_settings()),
                         corma::testing::UcxSettingName{});

/// A registry over a shared-memory reader whose owner has died, with a get
/// stranded on one of its regions.
struct DeadOwner {
  std::shared_ptr<corma::ucx::Backend> reader;
  std::shared_ptr<corma::Registry> registry;
  corma::RegionGuard guard;
  std::vector<std::byte> source = std::vector<std::byte>(1 << 16);

  void set_up() {
    const corma::ucx::Config config{.transport = corma::ucx::Transport::shared_memory,
                                    .error_handling = corma::ucx::ErrorHandling::none,
                                    .operation_timeout = std::chrono::milliseconds(300),
                                    .shutdown_timeout = std::chrono::seconds(2)};
    reader = make_ucx(config);
    auto owner = make_ucx(config);
    auto offer = reader->async_peer_offer(asio::use_future).get().value();
    auto answer = owner->async_peer_accept(offer.blob, asio::use_future).get().value();
    ASSERT_TRUE(reader->async_peer_complete(offer.peer, answer.blob, asio::use_future).get());
    auto exported = owner->async_map(source.data(), source.size(), Access::remote_read, asio::use_future).get();
    ASSERT_TRUE(exported) << exported.error().message();
    registry = std::make_shared<corma::Registry>(reader, corma::RegistryConfig{.budget_bytes = 1 << 30});
    auto registered = registry->async_register_owned(corma::OwnedBuffer::allocate(source.size()), Access::local,
                                                     asio::use_future).get();
    ASSERT_TRUE(registered) << registered.error().error.message();
    guard = std::move(registered).value();
    const corma::RemoteRegion remote{owner->wire_id(), 1, reinterpret_cast<std::uint64_t>(source.data()),
                                     source.size(), exported.value().packed_key};
    ASSERT_TRUE(guard.async_get(offer.peer, remote, {0, 0, 64}, asio::use_future).get());
    ASSERT_TRUE(owner->async_shutdown(asio::use_future).get());
    owner.reset();  // dead
    auto stranded = guard.async_get(offer.peer, remote, {0, 0, source.size()}, asio::use_future).get();
    ASSERT_FALSE(stranded) << "a get from a dead owner succeeded";
  }
};

TEST(UcxDeadShmOwner, TheRegistryAloneCannotReleaseARegionAStrandedGetPins) {
  DeadOwner dead;
  ASSERT_NO_FATAL_FAILURE(dead.set_up());
  dead.guard = corma::RegionGuard{};
  auto alone = dead.registry->async_shutdown(std::chrono::milliseconds(300), asio::use_future).get();
  ASSERT_FALSE(alone) << "the registry released a region the provider still holds";
  EXPECT_TRUE(alone.error().is(corma::errc::timeout)) << alone.error().message();
  EXPECT_EQ(dead.registry->stats().regions, 1u);
  EXPECT_TRUE(dead.reader->async_shutdown(asio::use_future).get());
}

TEST(UcxDeadShmOwner, TheRegistryThenTheBackendWithoutWaitingReleasesEverything) {
  DeadOwner dead;
  ASSERT_NO_FATAL_FAILURE(dead.set_up());
  dead.guard = corma::RegionGuard{};
  const auto start = std::chrono::steady_clock::now();
  auto registry_down = dead.registry->async_shutdown(std::chrono::seconds(10), asio::use_future);
  auto backend_down = dead.reader->async_shutdown(asio::use_future);
  ASSERT_EQ(registry_down.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto registry_result = registry_down.get();
  EXPECT_TRUE(registry_result) << registry_result.error().message();
  EXPECT_TRUE(backend_down.get());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  const auto stats = dead.registry->stats();
  EXPECT_EQ(stats.regions, 0u);
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.leaked_owned_buffers, 0u);
}

std::size_t threads_in_this_process() {
  std::size_t threads = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task")) ++threads;
  return threads;
}

TEST(UcxLastReference, ReleasedOnItsOwnProgressThreadTheBackendIsGoneBeforeTheProcessMayExit) {
  const corma::ucx::Config config{.transport = corma::ucx::Transport::shared_memory,
                                  .error_handling = corma::ucx::ErrorHandling::none};
  make_ucx(config).reset();  // whatever threads the provider keeps for the process are started
  const auto threads_before = threads_in_this_process();
  std::vector<std::byte> memory(4096);
  std::promise<std::thread::id> released;
  {
    auto backend = make_ucx(config);
    auto* initiator = backend.get();
    // No executor: the completion runs on the progress thread, and takes
    // the only reference with it.
    initiator->async_map(memory.data(), memory.size(), Access::local,
                         [last = std::move(backend), &released](corma::Result<corma::BackendRegion>) mutable {
                           last.reset();
                           released.set_value(std::this_thread::get_id());
                         });
  }
  EXPECT_NE(released.get_future().get(), std::this_thread::get_id()) << "not released on the progress thread";
  EXPECT_TRUE(corma::backend_kit::join_handed_over_threads(std::chrono::seconds(10)))
      << "the progress thread never said it finished";
  EXPECT_EQ(threads_in_this_process(), threads_before) << "a progress thread still runs";
}

}  // namespace
