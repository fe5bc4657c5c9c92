// FNV-1a, 64 bit: the integrity check on backends' packed keys. It catches
// corruption (a flipped byte, a spliced record) before a provider sees a key;
// it is not a MAC and does not stop a peer forging keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace corma::wire {

inline constexpr std::uint64_t fnv1a_basis = 0xcbf29ce484222325ULL;

/// Hashes `bytes`, continuing from `hash` (chain calls to hash several pieces).
[[nodiscard]] constexpr std::uint64_t fnv1a(std::span<const std::byte> bytes, std::uint64_t hash = fnv1a_basis) {
  for (auto b : bytes) {
    hash ^= static_cast<std::uint8_t>(b);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace corma::wire
