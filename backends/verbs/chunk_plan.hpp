// How one transfer becomes work requests: no work request may carry more
// than the port's max_msg_sz, and every transfer posts at least one (so every
// posted operation yields a completion). Pure arithmetic, unit-tested alone.
#pragma once

#include <cstdint>

namespace corma::verbs {

struct Chunk {
  std::uint64_t offset = 0;  ///< from the start of its block
  std::uint32_t len = 0;
  std::uint64_t block = 0;  ///< which block of a strided transfer (0 otherwise)
  friend bool operator==(const Chunk&, const Chunk&) = default;
};

class ChunkPlan {
 public:
  /// Plans `blocks` blocks of `len` bytes (a strided transfer's; one for a
  /// contiguous one), each in pieces of at most `max_chunk` (0 is read as
  /// the largest length a scatter/gather entry can carry).
  ChunkPlan(std::uint64_t len, std::uint32_t max_chunk, std::uint64_t blocks = 1) noexcept;

  /// Work requests to post: blocks x ceil(len / max_chunk), and 1 for zero
  /// bytes.
  [[nodiscard]] std::uint64_t count() const noexcept { return per_block_ * blocks_; }
  /// The i-th piece, i < count(), block after block: in each block all
  /// full-sized but the last.
  [[nodiscard]] Chunk operator[](std::uint64_t i) const noexcept;

 private:
  std::uint64_t len_;
  std::uint32_t max_chunk_;
  std::uint64_t blocks_;
  std::uint64_t per_block_;
};

}  // namespace corma::verbs
