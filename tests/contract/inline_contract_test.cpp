// The backend contract for work on the progress executor (docs/
// architecture.md, "Threading model"): a coroutine spawned on
// progress_executor() runs on the backend's progress thread, and its
// transfers complete there, inline, without a hop to another thread.
#include "contract/backend_contract.hpp"
#include "contract/contract_helpers.hpp"

#include "programs/children.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma::contract {
namespace {

struct InlineRun {
  int gets_ok = 0;
  int batches_ok = 0;
  int resumed_elsewhere = 0;  // resumptions on a thread other than the one that started
};

asio::awaitable<InlineRun> transfers_on_progress_thread(RdmaBackend& backend, TransferRequest request, int rounds) {
  InlineRun run;
  const auto started_on = std::this_thread::get_id();
  for (int i = 0; i < rounds; ++i) {
    auto got = co_await backend.async_get(request, asio::use_awaitable);
    if (got) ++run.gets_ok;
    if (std::this_thread::get_id() != started_on) ++run.resumed_elsewhere;
    auto batch = co_await backend.async_get_batch(TransferBatch(4, request), asio::use_awaitable);
    if (batch && batch.value().all_succeeded()) ++run.batches_ok;
    if (std::this_thread::get_id() != started_on) ++run.resumed_elsewhere;
  }
  co_return run;
}

TEST_P(BackendContract, CoroutinesOnTheProgressExecutorCompleteOnTheProgressThread) {
  constexpr int rounds = 50;
  constexpr std::size_t size = 4 * KiB;
  auto remote_buffer = OwnedBuffer::allocate(size);
  auto local_buffer = OwnedBuffer::allocate(size);
  fill(remote_buffer.data(), size, 81);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto remote = map(*pair.target.backend, remote_buffer.data(), size, Access::remote_read);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), size, Access::local);
  ASSERT_TRUE(local) << describe(local);
  const GetRequest request{pair.peer, local.value().id, 0, address(remote_buffer.data()), size,
                           remote.value().packed_key};

  auto finished = asio::co_spawn(initiator.progress_executor(),
                                 transfers_on_progress_thread(initiator, request, rounds), asio::use_future);
  ASSERT_EQ(finished.wait_for(answer_limit), std::future_status::ready) << "the coroutine never finished";
  const auto run = finished.get();
  EXPECT_EQ(run.gets_ok, rounds);
  EXPECT_EQ(run.batches_ok, rounds);
  EXPECT_EQ(run.resumed_elsewhere, 0) << "a completion hopped to another thread";
  EXPECT_TRUE(same_bytes(local_buffer.data(), remote_buffer.data(), size));
  EXPECT_TRUE(unmap(initiator, local.value().id));
}

/// Starts a guard batch of `gets` from the progress thread and tells whether
/// its answer ran inside the initiating function, and what it was.
struct EarlyAnswer {
  bool answered_inside = false;
  std::optional<Result<BatchOutcome>> outcome;
};

asio::awaitable<EarlyAnswer> batch_answered_inside(PeerId peer, std::vector<BatchedGet> gets) {
  EarlyAnswer seen;
  // Awaited too: a frame freed under its own initiation would crash here.
  auto awaited = co_await RegionGuard::async_get_batch(peer, gets, asio::use_awaitable);
  if (!awaited || awaited.value().failures.size() != gets.size()) co_return seen;
  bool initiating = true;
  std::optional<Result<BatchOutcome>> got;
  asio::steady_timer answered(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
  RegionGuard::async_get_batch(peer, std::move(gets),
                               asio::bind_executor(co_await asio::this_coro::executor, [&](Result<BatchOutcome> outcome) {
                                 seen.answered_inside = initiating;
                                 got = std::move(outcome);
                                 answered.cancel();
                               }));
  initiating = false;
  if (!got) (void)co_await answered.async_wait(asio::as_tuple(asio::use_awaitable));
  seen.outcome = std::move(got);
  co_return seen;
}

// docs/architecture.md: a handler is never invoked inside its initiating
// function, wherever it is started. A batch answered without reaching the
// backend (empty, or every element refused) from the backend's own
// progress thread, whose executor runs dispatched work inline, once ran
// its handler before async_get_batch returned: a coroutine's frame was then
// freed under its own initiation. The one exception the docs make: a plain
// callback (no executor of its own) about an empty batch (no backend to go
// through) runs inside, as nothing could run it later without a thread of
// corma's own.
TEST_P(BackendContract, AGuardBatchAnsweredWithoutTheBackendIsAnsweredInsideItsInitiationOnlyWithNowhereElseToRun) {
  constexpr std::size_t size = 4 * KiB;
  auto local_buffer = OwnedBuffer::allocate(size);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto registry = std::make_shared<Registry>(pair.initiator.backend, RegistryConfig{1 << 20, 0});
  auto registering = registry->async_register(local_buffer.bytes(), Access::local, asio::use_future);
  ASSERT_EQ(registering.wait_for(answer_limit), std::future_status::ready);
  auto guard = registering.get();
  ASSERT_TRUE(guard) << guard.error().message();
  // Outside the guard: refused before the backend sees it.
  std::vector<BatchedGet> refused{BatchedGet{&guard.value(), RemoteRegion{}, TransferRange{size, 0, 1}}};
  for (auto* gets : {static_cast<std::vector<BatchedGet>*>(nullptr), &refused}) {
    auto seen = asio::co_spawn(pair.initiator.backend->progress_executor(),
                               batch_answered_inside(pair.peer, gets ? *gets : std::vector<BatchedGet>{}),
                               asio::use_future);
    ASSERT_EQ(seen.wait_for(answer_limit), std::future_status::ready) << "the batch was never answered";
    const auto answer = seen.get();
    EXPECT_FALSE(answer.answered_inside) << (gets ? "a wholly refused" : "an empty") << " batch was answered inside "
                                         << "async_get_batch";
    ASSERT_TRUE(answer.outcome.has_value());
    ASSERT_TRUE(*answer.outcome) << answer.outcome->error().message();
    EXPECT_EQ(answer.outcome->value().failures.size(), gets ? 1U : 0U);
    // A handler with no executor of its own, from another thread: a refused
    // batch is answered through its guard's backend, an empty one here.
    std::atomic<bool> initiating{true};
    const auto test_thread = std::this_thread::get_id();
    std::promise<bool> inside;
    RegionGuard::async_get_batch(pair.peer, gets ? *gets : std::vector<BatchedGet>{}, [&](Result<BatchOutcome>) {
      inside.set_value(std::this_thread::get_id() == test_thread && initiating.load());
    });
    initiating = false;
    auto answered_inside = inside.get_future();
    ASSERT_EQ(answered_inside.wait_for(answer_limit), std::future_status::ready);
    EXPECT_EQ(answered_inside.get(), gets == nullptr)
        << (gets ? "a refused batch was answered inside async_get_batch, with a backend to answer through"
                 : "an empty batch's plain callback was answered later, on a thread corma had to find");
  }
  auto deregistering = guard.value().async_deregister(asio::use_future);
  ASSERT_EQ(deregistering.wait_for(answer_limit), std::future_status::ready);
  EXPECT_TRUE(deregistering.get());
}

// Work posted to the progress executor from a coroutine running on it runs:
// posts, co_spawn, awaitable operators and cancellations emitted inside an
// initiation, mixed at random with transfers, maps and timers
// (tests/programs/progress_mix.cpp). In child processes: a progress thread
// that hangs fails the child (it reports where each worker waited), not the
// suite.
TEST_P(BackendContract, WorkPostedFromTheProgressExecutorToItselfAlwaysRuns) {
  const auto& backend = GetParam().progress_mix;
  if (backend.empty()) GTEST_SKIP() << "no progress-mix program for this configuration";
  std::vector<std::vector<std::string>> children;
  for (const char* seed : {"1", "2", "3"}) children.push_back({CORMA_PROGRESS_MIX, backend, seed});
  const auto results = programs::testing::run_children(children, std::chrono::seconds(40));
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].output.starts_with("SKIPPED")) GTEST_SKIP() << results[i].output;
    EXPECT_EQ(results[i].status, 0) << programs::testing::describe(children[i], results[i]);
  }
}

}  // namespace
}  // namespace corma::contract
