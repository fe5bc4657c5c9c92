// libFuzzer target: a whole control frame (length prefix + body) through
// decode_frame_length and decode_frame_body. Whatever the body decoder
// accepts must re-encode to the same bytes and decode back to the same
// frame; anything else aborts.
#include "roundtrip.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes{reinterpret_cast<const std::byte*>(data), size};
  const auto check = corma::fuzz::check_frame(bytes);
  if (!check.mismatch.empty()) {
    std::fprintf(stderr, "frame round trip: %s\n", check.mismatch.c_str());
    std::abort();
  }
  return 0;
}
