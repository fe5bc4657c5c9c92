// Work on a backend's progress executor, mixed at random: coroutines there
// await transfers, maps and timers and then post back to that executor,
// co_spawn onto it, race operations with awaitable operators, and emit
// cancellations inside an initiation, all from the progress thread itself.
// Everything must run, on that thread. The mix uses only the RdmaBackend
// seam (public headers); the backend is picked by name, the test-only ones
// built from tests/support. Run as a child process by
// tests/programs/progress_mix_test.cpp, so that a hung progress thread is a
// failed run (exit 2, saying which worker waited where) and not a stuck
// test runner.
//
//   corma-progress-mix BACKEND SEED
//     BACKEND  test | ucx-tcp | ucx-shm | verbs-soft
#include "programs/child.hpp"
#include "programs/mix_backends.hpp"

#include <corma/backend.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using namespace std::chrono_literals;
using corma::programs::fail_run;

constexpr int workers = 8;
constexpr int steps_per_worker = 60;
constexpr std::size_t slot_size = 4096;

enum Step : int {
  post_after_get,
  spawn_after_get,
  race_get_with_timer,
  race_get_with_get,
  both_gets,
  cancel_inside_initiation,
  map_cancelled_inside_initiation,
  timer_then_get,
  batch_then_post,
  plain_post_then_get,
  step_kinds,
};

constexpr std::array<const char*, step_kinds> step_names = {
    "post after a get", "co_spawn after a get", "get || timer", "get || get", "get && get",
    "get cancelled inside its initiation", "map cancelled inside its initiation", "timer then get",
    "batch then post", "plain post then get"};

/// Where each worker is, for the watchdog's report.
struct Progress {
  std::array<std::atomic<int>, workers> step{};
  std::array<std::atomic<int>, workers> kind{};
  std::array<std::atomic<int>, workers> done{};

  std::string describe() const {
    std::string out;
    for (int w = 0; w < workers; ++w) {
      out += "\n  worker " + std::to_string(w) + ": ";
      if (done[w].load() != 0) {
        out += "done";
      } else {
        out += "step " + std::to_string(step[w].load()) + " (" + step_names[kind[w].load()] + ")";
      }
    }
    return out;
  }
};

struct Mix {
  corma::RdmaBackend& backend;
  std::vector<corma::TransferRequest> slots;  ///< one get per worker slot
  std::byte* mappable = nullptr;               ///< memory for the map steps, one page per worker
  std::thread::id progress_thread;
  Progress& progress;
  std::atomic<int> wrong_thread{0};
  std::atomic<int> failed_gets{0};
  std::string first_failure;
  std::mutex failure_mutex;

  void check_thread() {
    if (std::this_thread::get_id() != progress_thread) wrong_thread.fetch_add(1);
  }
  void expect(const corma::Result<void>& r, bool may_be_cancelled, const char* what) {
    if (r || (may_be_cancelled && r.error().is(corma::errc::cancelled))) return;
    failed_gets.fetch_add(1);
    std::lock_guard lock(failure_mutex);
    if (first_failure.empty()) first_failure = std::string(what) + ": " + r.error().message();
  }
};

asio::awaitable<corma::Result<void>> get(Mix& mix, int w) {
  co_return co_await mix.backend.async_get(mix.slots[static_cast<std::size_t>(w)], asio::use_awaitable);
}

/// A child coroutine spawned from the progress thread: a get, then a post.
asio::awaitable<void> child(Mix& mix, int w) {
  mix.expect(co_await get(mix, w), false, "spawned get");
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  mix.check_thread();
}

asio::awaitable<void> step(Mix& mix, int w, Step kind, std::mt19937& rng) {
  auto ex = co_await asio::this_coro::executor;
  switch (kind) {
    case post_after_get: {
      auto r = co_await get(mix, w);
      mix.check_thread();
      mix.expect(r, false, "get");
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case spawn_after_get: {
      auto r = co_await get(mix, w);
      mix.expect(r, false, "get");
      co_await asio::co_spawn(ex, child(mix, w), asio::use_awaitable);
      break;
    }
    case race_get_with_timer: {
      asio::steady_timer timer(ex, std::chrono::microseconds(rng() % 50));
      auto raced = co_await (get(mix, w) || timer.async_wait(asio::use_awaitable));
      if (raced.index() == 0) mix.expect(std::get<0>(raced), true, "raced get");
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case race_get_with_get: {
      auto raced = co_await (get(mix, w) || get(mix, w));
      mix.expect(raced.index() == 0 ? std::get<0>(raced) : std::get<1>(raced), true, "raced get");
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case both_gets: {
      auto [a, b] = co_await (get(mix, w) && get(mix, w));
      mix.expect(a, false, "first of two gets");
      mix.expect(b, false, "second of two gets");
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case cancel_inside_initiation: {
      // The cancellation is emitted on the progress thread, inside the
      // initiating function, once the backend has installed its handler.
      asio::cancellation_signal signal;
      auto r = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(corma::Result<void>)>(
          [&](auto handler) {
            mix.backend.async_get(mix.slots[static_cast<std::size_t>(w)],
                                  asio::bind_cancellation_slot(signal.slot(), std::move(handler)));
            signal.emit(asio::cancellation_type::terminal);
          },
          asio::use_awaitable);
      mix.expect(r, true, "get cancelled in its initiation");
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case map_cancelled_inside_initiation: {
      asio::cancellation_signal signal;
      std::byte* page = mix.mappable + static_cast<std::size_t>(w) * slot_size;
      auto mapped = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(corma::Result<corma::BackendRegion>)>(
          [&](auto handler) {
            mix.backend.async_map(page, slot_size, corma::Access::local,
                                  asio::bind_cancellation_slot(signal.slot(), std::move(handler)));
            signal.emit(asio::cancellation_type::total);
          },
          asio::use_awaitable);
      mix.check_thread();
      if (mapped) {
        auto unmapped = co_await mix.backend.async_unmap(mapped.value().id, asio::use_awaitable);
        mix.expect(unmapped, false, "unmap");
      } else {
        mix.expect(corma::Result<void>(mapped.error()), true, "cancelled map");
      }
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case timer_then_get: {
      asio::steady_timer timer(ex, std::chrono::microseconds(rng() % 100));
      co_await timer.async_wait(asio::use_awaitable);
      mix.check_thread();
      mix.expect(co_await get(mix, w), false, "get after a timer");
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case batch_then_post: {
      auto batch = co_await mix.backend.async_get_batch(
          corma::TransferBatch(3, mix.slots[static_cast<std::size_t>(w)]), asio::use_awaitable);
      if (!batch || !batch.value().all_succeeded()) {
        mix.expect(batch ? corma::fail(corma::errc::backend, "an element failed") : corma::Result<void>(batch.error()),
                   false, "batch");
      }
      co_await asio::post(ex, asio::use_awaitable);
      break;
    }
    case plain_post_then_get: {
      // A plain function posted from the progress thread, then awaited by
      // posting until it ran.
      bool ran = false;
      asio::post(ex, [&ran] { ran = true; });
      while (!ran) co_await asio::post(ex, asio::use_awaitable);
      mix.expect(co_await get(mix, w), false, "get after a post");
      break;
    }
    case step_kinds:
      break;
  }
  mix.check_thread();
}

asio::awaitable<void> worker(Mix& mix, int w, unsigned seed) {
  std::mt19937 rng(seed);
  for (int s = 0; s < steps_per_worker; ++s) {
    const auto kind = static_cast<Step>(rng() % step_kinds);
    mix.progress.kind[static_cast<std::size_t>(w)].store(kind);
    mix.progress.step[static_cast<std::size_t>(w)].store(s);
    co_await step(mix, w, kind, rng);
  }
  mix.progress.done[static_cast<std::size_t>(w)].store(1);
}

/// Spawns every worker from the progress thread and waits for the last one
/// through a timer it cancels.
asio::awaitable<void> driver(Mix& mix, unsigned seed) {
  auto ex = co_await asio::this_coro::executor;
  mix.progress_thread = std::this_thread::get_id();
  asio::steady_timer all_done(ex, asio::steady_timer::time_point::max());
  int remaining = workers;
  for (int w = 0; w < workers; ++w) {
    asio::co_spawn(ex, worker(mix, w, seed * 131 + static_cast<unsigned>(w)), [&](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
      if (--remaining == 0) all_done.cancel();
    });
  }
  while (remaining != 0) {
    boost::system::error_code ec;
    co_await all_done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s BACKEND SEED\n", argv[0]);
    return corma::programs::exit_usage;
  }
  const std::string name = argv[1];
  const auto seed = static_cast<unsigned>(std::stoul(argv[2]));
  std::string unavailable;
  auto pair = corma::programs::make_pair(name, unavailable);
  if (!pair.initiator) {
    std::printf("SKIPPED: %s\n", unavailable.c_str());
    return 0;
  }
  auto& initiator = *pair.initiator;
  auto& target = *pair.target;

  std::vector<std::byte> remote(workers * slot_size);
  std::vector<std::byte> local(workers * slot_size);
  std::vector<std::byte> mappable(workers * slot_size);
  std::memset(remote.data(), 0x3c, remote.size());
  auto remote_region = target.async_map(remote.data(), remote.size(), corma::Access::remote_read, asio::use_future).get();
  if (!remote_region) fail_run("remote map: " + remote_region.error().message());
  auto local_region = initiator.async_map(local.data(), local.size(), corma::Access::local, asio::use_future).get();
  if (!local_region) fail_run("local map: " + local_region.error().message());

  Progress progress;
  Mix mix{initiator, {}, mappable.data(), {}, progress, {}, {}, {}, {}};
  for (int w = 0; w < workers; ++w) {
    const std::uint64_t at = static_cast<std::uint64_t>(w) * slot_size;
    mix.slots.push_back({pair.peer, local_region.value().id, at, reinterpret_cast<std::uint64_t>(remote.data()) + at,
                         slot_size, remote_region.value().packed_key});
  }
  {
    corma::programs::Watchdog watchdog(10s, [&] { return "the mix on " + name + ":" + progress.describe(); });
    auto finished = asio::co_spawn(initiator.progress_executor(), driver(mix, seed), asio::use_future);
    finished.get();
  }
  if (mix.wrong_thread.load() != 0) fail_run(std::to_string(mix.wrong_thread.load()) + " resumptions off the progress thread");
  if (mix.failed_gets.load() != 0) fail_run(std::to_string(mix.failed_gets.load()) + " operations failed; first: " + mix.first_failure);
  corma::programs::Watchdog watchdog(20s, [] { return std::string("unmapping and shutting the backends down"); });
  // A get answered `cancelled` may still land: the unmap waits until every
  // transfer into the region has really ended.
  auto unmapped = initiator.async_unmap(local_region.value().id, asio::use_future).get();
  if (!unmapped) fail_run("local unmap: " + unmapped.error().message());
  if (std::memcmp(local.data(), remote.data(), local.size()) != 0) fail_run("the gets brought the wrong bytes");

  auto down = initiator.async_shutdown(asio::use_future).get();
  if (!down) fail_run("initiator shutdown: " + down.error().message());
  auto target_down = target.async_shutdown(asio::use_future).get();
  if (!target_down) fail_run("target shutdown: " + target_down.error().message());
  std::printf("OK %s seed %u: %d workers x %d steps\n", name.c_str(), seed, workers, steps_per_worker);
  return 0;
}
