// A registry and its UCX backend, peered over trusted tcp with hundreds of
// operations of every kind in flight, shut down in each documented order:
// 20 runs an order, 100 in all, each in a child process (programs/
// shutdown_orders.cpp), so that a UCX abort is a failed run. Half the runs
// shut down while the operations are still starting the endpoint's
// wire-up, with the peer's backend shutting down at the same moment: UCX
// 1.13 aborted the process in a quarter of those runs until the backend
// settled its worker before destroying it (backends/ucx/engine_shutdown.cpp).
// Four children at a time, so an order takes seconds.
#include "programs/child.hpp"
#include "programs/children.hpp"

#include <string>
#include <vector>

namespace {

using corma::programs::testing::describe;
using corma::programs::testing::run_children;

class UcxShutdownOrders : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxShutdownOrders, NeverAbortAndAnswerEveryCaller) {
  constexpr int runs_per_child = 5;
  const std::string runs = std::to_string(runs_per_child);
  const std::vector<std::vector<std::string>> children = {
      {CORMA_SHUTDOWN_ORDERS, GetParam(), "tcp", runs, "--during-wire-up", "--with-target"},
      {CORMA_SHUTDOWN_ORDERS, GetParam(), "tcp", runs, "--during-wire-up", "--with-target"},
      {CORMA_SHUTDOWN_ORDERS, GetParam(), "tcp", runs, "--during-wire-up"},
      {CORMA_SHUTDOWN_ORDERS, GetParam(), "tcp", runs, "--with-target"},
  };
  const auto results = run_children(children, std::chrono::seconds(50));
  for (std::size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].status, 0) << describe(children[i], results[i]);
  }
}

// The moment itself, made on purpose (programs/reply_pending.cpp): a target
// shutting down while its wire-up reply waits for a busy initiator.
TEST(UcxWireUp, ATargetShuttingDownWithItsReplyQueuedSurvives) {
  const std::vector<std::string> child = {CORMA_REPLY_PENDING, "5"};
  const auto result = run_children({child}, std::chrono::seconds(40)).front();
  if (result.status == corma::programs::exit_not_made) GTEST_SKIP() << describe(child, result);
  EXPECT_EQ(result.status, 0) << describe(child, result);
}

INSTANTIATE_TEST_SUITE_P(Tcp, UcxShutdownOrders,
                         ::testing::Values("same_tick", "backend_first", "registry_first", "backend_then_registry",
                                           "registry_then_backend"),
                         [](const ::testing::TestParamInfo<std::string>& order) { return order.param; });

}  // namespace
