// detail::BulkHandoff: completions dispatched inside a scope reach their
// executors when it closes, in order, one hand-off per executor.
#include <corma/detail/completion.hpp>
#include <corma/error.hpp>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Result;
using corma::detail::BulkHandoff;
using corma::detail::Completion;

Completion<void(Result<int>)> completion_on(asio::io_context& io, std::vector<int>& seen) {
  return Completion<void(Result<int>)>(
      asio::bind_executor(io, [&seen](Result<int> r) { seen.push_back(r ? r.value() : -1); }));
}

TEST(BulkHandoff, CompletionsForOneExecutorArriveTogetherInOrderWhenTheScopeCloses) {
  asio::io_context first;
  asio::io_context second;
  std::vector<int> seen_first;
  std::vector<int> seen_second;
  {
    BulkHandoff bulk;
    for (int i = 0; i < 5; ++i) completion_on(first, seen_first).dispatch(i);
    completion_on(second, seen_second).dispatch(100);
    // Nothing has reached either context yet.
    EXPECT_EQ(first.poll(), 0u);
    EXPECT_EQ(second.poll(), 0u);
  }
  first.restart();
  second.restart();
  EXPECT_EQ(first.poll(), 1u) << "five completions took more than one hand-off";
  EXPECT_EQ(second.poll(), 1u);
  EXPECT_EQ(seen_first, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(seen_second, (std::vector<int>{100}));
}

TEST(BulkHandoff, WithoutAScopeEachCompletionIsHandedOverAtOnce) {
  asio::io_context io;
  std::vector<int> seen;
  for (int i = 0; i < 3; ++i) completion_on(io, seen).dispatch(i);
  EXPECT_EQ(io.poll(), 3u);
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
}

TEST(BulkHandoff, ACompletionDispatchedWhileFlushingIsHandedOverToo) {
  asio::io_context io;
  std::vector<int> seen;
  {
    BulkHandoff bulk;
    // Runs inline at the flush (no executor bound: Asio's default) and
    // completes another operation from there.
    Completion<void(Result<int>)>([&](Result<int>) { completion_on(io, seen).dispatch(7); }).dispatch(1);
  }
  io.restart();
  io.poll();
  EXPECT_EQ(seen, (std::vector<int>{7}));
}

}  // namespace
