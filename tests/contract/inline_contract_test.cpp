// The backend contract for work on the progress executor (docs/
// architecture.md, "Threading model"): a coroutine spawned on
// progress_executor() runs on the backend's progress thread, and its
// transfers complete there, inline, without a hop to another thread.
#include "contract/backend_contract.hpp"
#include "contract/contract_helpers.hpp"

#include "programs/children.hpp"

#include <boost/asio/co_spawn.hpp>
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
