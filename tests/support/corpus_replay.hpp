// Replaying a fuzzer's checked-in seed corpus (fuzz/corpus/<name>) through
// the property it checks, so every build (not only Clang fuzz builds)
// exercises it. The test defines CORMA_FUZZ_CORPUS_DIR as fuzz/corpus.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#ifndef CORMA_FUZZ_CORPUS_DIR
#error "CORMA_FUZZ_CORPUS_DIR must name fuzz/corpus"
#endif

namespace corma::testing {

inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
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

/// Runs `check` (returning a corma::fuzz::Check) over every file of the
/// corpus; each mismatch fails the test.
template <class CheckFn>
Replayed replay(const std::string& corpus, CheckFn check) {
  namespace fs = std::filesystem;
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

}  // namespace corma::testing
