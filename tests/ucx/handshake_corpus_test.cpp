// Replays the handshake fuzzer's seed corpus (fuzz/corpus/handshake) through
// its property (fuzz/handshake.hpp): real UCX backends, the owner's hello path.
#include "handshake.hpp"
#include "support/corpus_replay.hpp"

#include <gtest/gtest.h>

namespace {

TEST(CorpusReplay, HandshakeCorpus) {
  for (const auto& subject : corma::fuzz::handshake_subjects()) {
    const auto replayed = corma::testing::replay(
        "handshake", [&subject](auto bytes) { return corma::fuzz::check_handshake(bytes, subject); });
    EXPECT_GE(replayed.files, 10U);
    EXPECT_GT(replayed.accepted, 0U) << "no offer the owner takes in the corpus";
    EXPECT_LT(replayed.accepted, replayed.files) << "no hostile hello in the corpus";
  }
}

}  // namespace
