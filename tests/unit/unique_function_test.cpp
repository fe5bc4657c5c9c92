// detail::UniqueFunction: move-only callables, kept inline when small, each
// destroyed exactly once whether called, moved or dropped.
#include <corma/detail/unique_function.hpp>

#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <utility>

namespace corma::detail {
namespace {

/// Counts its live copies through a shared counter.
struct Tracked {
  explicit Tracked(std::shared_ptr<int> counter) : live(std::move(counter)) { ++*live; }
  Tracked(Tracked&& other) noexcept : live(other.live) { ++*live; }
  Tracked(const Tracked&) = delete;
  ~Tracked() { --*live; }
  std::shared_ptr<int> live;
};

TEST(UniqueFunction, HoldsAMoveOnlyCallableAndCallsIt) {
  auto value = std::make_unique<int>(41);
  int seen = 0;
  UniqueFunction f([value = std::move(value), &seen] { seen = *value + 1; });
  ASSERT_TRUE(f);
  f();
  EXPECT_EQ(seen, 42);
}

TEST(UniqueFunction, SmallAndLargeCallablesAreEachDestroyedOnceAcrossMoves) {
  auto live = std::make_shared<int>(0);
  int calls = 0;
  std::array<char, UniqueFunction::inline_size * 2> ballast{};  // forces the heap
  {
    UniqueFunction small([t = Tracked(live), &calls] { ++calls; });
    UniqueFunction large([t = Tracked(live), ballast, &calls] { calls += 1 + ballast[0]; });
    EXPECT_EQ(*live, 2);
    UniqueFunction moved_small(std::move(small));
    UniqueFunction moved_large(std::move(large));
    EXPECT_FALSE(small);  // NOLINT(bugprone-use-after-move): a moved-from function is empty
    EXPECT_FALSE(large);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(*live, 2);
    moved_small();
    moved_large();
    small = std::move(moved_small);
    EXPECT_EQ(*live, 2);
    large = nullptr;  // already empty: nothing to destroy
    moved_large = nullptr;
    EXPECT_EQ(*live, 1);
  }
  EXPECT_EQ(*live, 0);
  EXPECT_EQ(calls, 2);
}

TEST(UniqueFunction, MoveAssignmentDestroysTheTargetsCallableFirst) {
  auto live = std::make_shared<int>(0);
  UniqueFunction a([t = Tracked(live)] {});
  UniqueFunction b([t = Tracked(live)] {});
  EXPECT_EQ(*live, 2);
  a = std::move(b);
  EXPECT_EQ(*live, 1);
  a = std::move(a);  // NOLINT(clang-diagnostic-self-move): self-assignment keeps it
  EXPECT_TRUE(a);
  EXPECT_EQ(*live, 1);
}

}  // namespace
}  // namespace corma::detail
