// Types shared by the rendezvous Owner and Consumer.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace corma {

/// Which path moved an object's bytes.
enum class Path {
  rdma,     ///< one-sided get from the owner's registered memory
  chunked,  ///< pulled in bounds-checked chunks over the control connection
};

[[nodiscard]] constexpr const char* to_string(Path path) noexcept {
  return path == Path::rdma ? "rdma" : "chunked";
}

/// Decisions counted by path and reason ("budget", "no_offer", ...).
struct PathCounters {
  std::uint64_t rdma = 0;
  std::map<std::string, std::uint64_t> chunked_by_reason;

  [[nodiscard]] std::uint64_t chunked() const noexcept {
    std::uint64_t n = 0;
    for (const auto& [reason, count] : chunked_by_reason) n += count;
    return n;
  }
};

}  // namespace corma
