// The verbs chunk planner: how a transfer becomes work requests.
#include "chunk_plan.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace corma::verbs {
namespace {

/// The pieces in order must tile [0, len) exactly, none empty (unless the
/// transfer is), none over the limit.
void expect_exact_tiling(const ChunkPlan& plan, std::uint64_t len, std::uint32_t max_chunk) {
  std::uint64_t next = 0;
  for (std::uint64_t i = 0; i < plan.count(); ++i) {
    const Chunk c = plan[i];
    EXPECT_EQ(c.offset, next) << "piece " << i;
    EXPECT_LE(c.len, max_chunk) << "piece " << i;
    if (len != 0) {
      EXPECT_GT(c.len, 0u) << "piece " << i;
    }
    next += c.len;
  }
  EXPECT_EQ(next, len);
}

TEST(ChunkPlan, TwoAndAHalfTimesTheLimitPlansThreeWorkRequests) {
  constexpr std::uint32_t max = 64 * 1024;
  const ChunkPlan plan(max * 5ULL / 2, max);
  ASSERT_EQ(plan.count(), 3u);
  EXPECT_EQ(plan[0], (Chunk{0, max}));
  EXPECT_EQ(plan[1], (Chunk{max, max}));
  EXPECT_EQ(plan[2], (Chunk{2ULL * max, max / 2}));
  expect_exact_tiling(plan, max * 5ULL / 2, max);
}

TEST(ChunkPlan, AnExactMultiplePlansNoEmptyTail) {
  constexpr std::uint32_t max = 4096;
  const ChunkPlan plan(4ULL * max, max);
  ASSERT_EQ(plan.count(), 4u);
  EXPECT_EQ(plan[3], (Chunk{3ULL * max, max}));
  expect_exact_tiling(plan, 4ULL * max, max);
}

TEST(ChunkPlan, ZeroBytesPlansExactlyOneEmptyWorkRequest) {
  const ChunkPlan plan(0, 4096);
  ASSERT_EQ(plan.count(), 1u);
  EXPECT_EQ(plan[0], (Chunk{0, 0}));
}

TEST(ChunkPlan, SmallAndBoundaryLengthsTileExactly) {
  for (std::uint32_t max : {1u, 3u, 4096u, 1u << 20}) {
    for (std::uint64_t len : {1ULL, 2ULL, 4095ULL, 4096ULL, 4097ULL, (1ULL << 20) + 1, 3ULL << 20}) {
      const ChunkPlan plan(len, max);
      EXPECT_EQ(plan.count(), (len + max - 1) / max) << len << " / " << max;
      expect_exact_tiling(plan, len, max);
    }
  }
}

TEST(ChunkPlan, NoLimitMeansTheLargestScatterGatherLength) {
  constexpr auto sge_max = std::numeric_limits<std::uint32_t>::max();
  const ChunkPlan plan(3ULL * sge_max, 0);
  ASSERT_EQ(plan.count(), 3u);
  expect_exact_tiling(plan, 3ULL * sge_max, sge_max);
}

TEST(ChunkPlan, StridedBlocksArePlannedBlockAfterBlockEachTiledAlone) {
  constexpr std::uint32_t max = 4096;
  constexpr std::uint64_t block = max * 2 + 100;  // three pieces a block
  const ChunkPlan plan(block, max, 5);
  ASSERT_EQ(plan.count(), 15u);
  for (std::uint64_t b = 0; b < 5; ++b) {
    EXPECT_EQ(plan[b * 3], (Chunk{0, max, b}));
    EXPECT_EQ(plan[b * 3 + 1], (Chunk{max, max, b}));
    EXPECT_EQ(plan[b * 3 + 2], (Chunk{2ULL * max, 100, b}));
  }
  const ChunkPlan small(64, max, 1024);
  ASSERT_EQ(small.count(), 1024u);
  EXPECT_EQ(small[1023], (Chunk{0, 64, 1023}));
}

}  // namespace
}  // namespace corma::verbs
