// Replays the fuzzers' checked-in seed corpora (fuzz/corpus) through the
// decoders and the round-trip check, so every build (not only Clang fuzz
// builds) exercises them.
#include "roundtrip.hpp"

#include "support/corpus_replay.hpp"

#include <gtest/gtest.h>

namespace {

using corma::testing::replay;

TEST(CorpusReplay, DescriptorCorpus) {
  const auto replayed = replay("descriptor", [](auto bytes) { return corma::fuzz::check_descriptor(bytes); });
  EXPECT_GE(replayed.files, 10U);
  EXPECT_GT(replayed.accepted, 0U) << "no valid descriptor in the corpus";
  EXPECT_LT(replayed.accepted, replayed.files) << "no invalid descriptor in the corpus";
}

TEST(CorpusReplay, FrameCorpus) {
  const auto replayed = replay("frame", [](auto bytes) { return corma::fuzz::check_frame(bytes); });
  EXPECT_GE(replayed.files, 10U);
  EXPECT_GT(replayed.accepted, 0U) << "no valid frame in the corpus";
  EXPECT_LT(replayed.accepted, replayed.files) << "no invalid frame in the corpus";
}

}  // namespace
