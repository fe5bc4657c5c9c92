// Replays the fuzzers' checked-in seed corpora (fuzz/corpus) through the
// decoders and the round-trip check, so every build (not only Clang fuzz
// builds) exercises them.
#include "roundtrip.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#ifndef CORMA_FUZZ_CORPUS_DIR
#error "CORMA_FUZZ_CORPUS_DIR must name fuzz/corpus"
#endif

namespace {

namespace fs = std::filesystem;

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::byte> bytes(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) bytes[i] = static_cast<std::byte>(chars[i]);
  return bytes;
}

struct Replayed {
  std::size_t files = 0;
  std::size_t accepted = 0;
};

template <class CheckFn>
Replayed replay(const std::string& corpus, CheckFn check) {
  Replayed replayed;
  const fs::path dir = fs::path(CORMA_FUZZ_CORPUS_DIR) / corpus;
  EXPECT_TRUE(fs::is_directory(dir)) << dir;
  if (!fs::is_directory(dir)) return replayed;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    ++replayed.files;
    const auto bytes = read_file(entry.path());
    const auto result = check(std::span<const std::byte>(bytes));
    EXPECT_TRUE(result.mismatch.empty()) << entry.path() << ": " << result.mismatch;
    if (result.accepted) ++replayed.accepted;
  }
  return replayed;
}

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
