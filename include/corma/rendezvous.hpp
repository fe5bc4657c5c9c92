// Types shared by the rendezvous Owner and Consumer.
#pragma once

#include <corma/error.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace corma {

/// Object names are at most this long; a frame naming a longer one is
/// malformed.
inline constexpr std::size_t max_object_name_length = 4096;

/// What an object name may be, for every owner: 1..max_object_name_length
/// bytes, none of them a control character (0x00-0x1F, 0x7F; a NUL in
/// particular would end the name early for every C interface it reaches).
/// `out_of_range` for a length outside the bounds; `not_owned` for a
/// forbidden byte (an owner answers so before it looks the name up).
Result<void> check_object_name(std::string_view name);

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
