// How one transfer becomes work requests: no work request may carry more
// than the port's max_msg_sz, and every transfer posts at least one (so every
// posted operation yields a completion). Pure arithmetic, unit-tested alone.
#pragma once

#include <cstdint>

namespace corma::verbs {

struct Chunk {
  std::uint64_t offset = 0;  ///< from the start of the transfer
  std::uint32_t len = 0;
  friend bool operator==(const Chunk&, const Chunk&) = default;
};

class ChunkPlan {
 public:
  /// Plans `len` bytes in pieces of at most `max_chunk` (0 is read as the
  /// largest length a scatter/gather entry can carry).
  ChunkPlan(std::uint64_t len, std::uint32_t max_chunk) noexcept;

  /// Work requests to post: ceil(len / max_chunk), and 1 for zero bytes.
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
  /// The i-th piece, i < count(): all full-sized but the last.
  [[nodiscard]] Chunk operator[](std::uint64_t i) const noexcept;

 private:
  std::uint64_t len_;
  std::uint32_t max_chunk_;
  std::uint64_t count_;
};

}  // namespace corma::verbs
