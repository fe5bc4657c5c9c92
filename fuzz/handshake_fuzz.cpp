// libFuzzer target: the owner's handshake end to end through real UCX
// backends in-process (fuzz/handshake.hpp). The input is the body of the
// first frame an owner reads; every input goes to a shared-memory backend and
// to a trusted tcp one on loopback, both made once.
#include "handshake.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

namespace {

const std::vector<corma::fuzz::HandshakeSubject>& subjects() {
  static const auto made = corma::fuzz::handshake_subjects();
  return made;
}

}  // namespace

// UCX keeps some of its own allocations reachable only from memory it maps
// itself, which LeakSanitizer does not scan: what UCX allocates is left out
// of leak reports (corma's own allocations are not).
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\n";
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  subjects();  // before the first input, so start-up is not timed as one
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> body{reinterpret_cast<const std::byte*>(data), size};
  for (const auto& subject : subjects()) {
    const auto check = corma::fuzz::check_handshake(body, subject);
    if (!check.mismatch.empty()) {
      std::fprintf(stderr, "handshake: %s\n", check.mismatch.c_str());
      std::abort();
    }
  }
  return 0;
}
