// A randomized soak over real UCX backends (shared memory and tcp): several
// coroutines register random slices, read random slices of a peer's region,
// and drop guards or cancel at random moments (immediately, after a short
// timer, through an awaitable_operators race). At the end every operation
// was answered exactly once, every successful read was byte-exact, and
// nothing is left registered, reserved or mapped.
#include "support/run.hpp"

#include <corma/registry.hpp>
#include <corma/ucx.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace {

namespace asio = boost::asio;
namespace ucx = corma::ucx;
using namespace asio::experimental::awaitable_operators;
using corma::Access;
using corma::errc;

constexpr std::size_t remote_size = 4 << 20;
constexpr std::size_t arena_size = 1 << 20;

struct Counts {
  std::uint64_t started = 0;
  std::uint64_t answered = 0;
  std::uint64_t verified = 0;
  std::uint64_t mismatched = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t unexpected = 0;  // failures other than cancellation, budget or a deliberate timeout
  std::string first_unexpected;
};

struct Peer {
  corma::PeerId peer{};
  corma::RemoteRegion remote;
  const std::vector<std::byte>* bytes = nullptr;
};

/// Why an operation may legitimately fail in the soak.
bool expected_failure(const corma::Error& error) {
  return error.is(errc::cancelled) || error.is(errc::budget_exceeded) || error.is(errc::timeout);
}

void tally(Counts& counts, const corma::Result<void>& result) {
  ++counts.answered;
  if (result) return;
  if (result.error().is(errc::cancelled)) ++counts.cancelled;
  if (!expected_failure(result.error())) {
    if (counts.unexpected++ == 0) counts.first_unexpected = result.error().message();
  }
}

/// One worker: random registrations, reads, drops and cancellations until `until`.
asio::awaitable<void> worker(corma::Registry& registry, const Peer& peer, unsigned seed,
                             std::chrono::steady_clock::time_point until, Counts& counts) {
  auto executor = co_await asio::this_coro::executor;
  std::mt19937_64 rng(seed);
  std::vector<std::byte> arena(arena_size);
  asio::steady_timer timer(executor);
  while (std::chrono::steady_clock::now() < until) {
    const std::size_t offset = rng() % (arena_size / 2);
    const std::size_t size = 1 + rng() % (arena_size / 2);
    const int style = static_cast<int>(rng() % 4);
    ++counts.started;
    std::span<std::byte> slice(arena.data() + offset, size);
    if (style == 0) {
      // A registration cancelled at once: answered, nothing left behind.
      asio::cancellation_signal cancel;
      auto pending = registry.async_register(slice, Access::local,
                                             asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
      cancel.emit(asio::cancellation_type::terminal);
      auto guard = co_await std::move(pending);
      tally(counts, guard ? corma::Result<void>(corma::success()) : corma::Result<void>(guard.error()));
      continue;
    }
    auto guard = co_await registry.async_register(slice, Access::local, asio::use_awaitable);
    if (!guard) {
      tally(counts, guard.error());
      continue;
    }
    ++counts.answered;
    const std::uint64_t len = 1 + rng() % std::min<std::uint64_t>(size, 256 * 1024);
    const std::uint64_t remote_offset = rng() % (remote_size - len);
    const corma::TransferRange range{0, remote_offset, len};
    ++counts.started;
    if (style == 1) {
      // A read raced against a short timer: the loser is cancelled (terminal).
      timer.expires_after(std::chrono::microseconds(rng() % 200));
      auto raced = co_await (guard.value().async_get(peer.peer, peer.remote, range, asio::use_awaitable) ||
                             timer.async_wait(asio::as_tuple(asio::use_awaitable)));
      if (raced.index() == 0) {
        auto& got = std::get<0>(raced);
        tally(counts, got);
        if (got) ++(std::memcmp(slice.data(), peer.bytes->data() + remote_offset, len) == 0 ? counts.verified
                                                                                             : counts.mismatched);
      } else {
        ++counts.answered;  // cancelled by the race: answered through the operator
        ++counts.cancelled;
      }
    } else {
      auto got = co_await guard.value().async_get(peer.peer, peer.remote, range, asio::use_awaitable);
      tally(counts, got);
      if (got) {
        ++(std::memcmp(slice.data(), peer.bytes->data() + remote_offset, len) == 0 ? counts.verified
                                                                                   : counts.mismatched);
      }
    }
    if (style == 3) {
      // Deregistered explicitly (and awaited) instead of dropped.
      ++counts.started;
      tally(counts, co_await guard.value().async_deregister(asio::use_awaitable));
    }
    // Otherwise dropped: deregistered in the background. Either way the
    // slice is reused only once the registration is gone.
    auto released = guard.value().deregistered();
    guard = corma::fail(errc::region_not_found, "dropped");
    co_await released.async_wait(asio::use_awaitable);
  }
}

void soak(ucx::Config config, std::chrono::seconds length) {
  auto reader = ucx::Backend::create(config).value();
  auto owner = ucx::Backend::create(config).value();
  std::vector<std::byte> source(remote_size);
  std::mt19937_64 fill(99);
  for (auto& b : source) b = static_cast<std::byte>(fill());

  auto offer = reader->async_peer_offer(asio::use_future).get().value();
  auto answer = owner->async_peer_accept(offer.blob, asio::use_future).get().value();
  ASSERT_TRUE(reader->async_peer_complete(offer.peer, answer.blob, asio::use_future).get());
  auto exported = owner->async_map(source.data(), source.size(), Access::remote_read, asio::use_future).get().value();
  Peer peer{offer.peer,
            {owner->wire_id(), 1, reinterpret_cast<std::uint64_t>(source.data()), source.size(), exported.packed_key},
            &source};

  auto registry = std::make_shared<corma::Registry>(reader, corma::RegistryConfig{.budget_bytes = 3 * arena_size});
  asio::io_context io;
  constexpr int workers = 6;
  std::vector<Counts> counts(workers);
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + length;
  corma::testing::run(
      io,
      [&]() -> asio::awaitable<void> {
        std::vector<std::unique_ptr<bool>> done;
        for (int w = 0; w < workers; ++w) {
          done.push_back(std::make_unique<bool>(false));
          asio::co_spawn(io, worker(*registry, peer, 1000u + static_cast<unsigned>(w), until, counts[static_cast<std::size_t>(w)]),
                         [flag = done.back().get()](std::exception_ptr e) {
                           if (e) std::rethrow_exception(e);
                           *flag = true;
                         });
        }
        asio::steady_timer poll(io);
        for (;;) {
          bool all = true;
          for (const auto& d : done) all = all && *d;
          if (all) break;
          poll.expires_after(std::chrono::milliseconds(10));
          co_await poll.async_wait(asio::use_awaitable);
        }
        auto shut = co_await registry->async_shutdown(std::chrono::seconds(10), asio::use_awaitable);
        EXPECT_TRUE(shut) << shut.error().message();
      }(),
      length + std::chrono::seconds(60));
  const auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  Counts total;
  for (const auto& c : counts) {
    total.started += c.started;
    total.answered += c.answered;
    total.verified += c.verified;
    total.mismatched += c.mismatched;
    total.cancelled += c.cancelled;
    total.unexpected += c.unexpected;
    if (total.first_unexpected.empty()) total.first_unexpected = c.first_unexpected;
  }
  std::printf("[ soak ] %s: %llu operations in %.1f s (%.0f/s), %llu reads verified, %llu cancelled\n",
              config.transport == ucx::Transport::tcp ? "tcp" : "shm",
              static_cast<unsigned long long>(total.started), elapsed, static_cast<double>(total.started) / elapsed,
              static_cast<unsigned long long>(total.verified), static_cast<unsigned long long>(total.cancelled));
  EXPECT_EQ(total.answered, total.started) << "every operation answered exactly once";
  EXPECT_EQ(total.mismatched, 0u);
  EXPECT_GT(total.verified, 0u);
  EXPECT_EQ(total.unexpected, 0u) << total.first_unexpected;
  const auto stats = registry->stats();
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.regions, 0u);

  ASSERT_TRUE(owner->async_unmap(exported.id, asio::use_future).get());
  ASSERT_TRUE(reader->async_shutdown(asio::use_future).get());
  ASSERT_TRUE(owner->async_shutdown(asio::use_future).get());
  EXPECT_EQ(reader->live_registrations(), 0u);
  EXPECT_EQ(owner->live_registrations(), 0u);
}

std::chrono::seconds soak_length() {
  const char* text = std::getenv("CORMA_SOAK_SECONDS");
  return std::chrono::seconds(text != nullptr ? std::atoi(text) : 25);
}

TEST(Soak, SharedMemory) {
  soak({.transport = ucx::Transport::shared_memory, .error_handling = ucx::ErrorHandling::none}, soak_length());
}

TEST(Soak, TrustedTcp) {
  soak({.transport = ucx::Transport::tcp, .trusted_peers = true}, soak_length());
}

}  // namespace
