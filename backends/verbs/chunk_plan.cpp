#include "chunk_plan.hpp"

#include <limits>

namespace corma::verbs {

ChunkPlan::ChunkPlan(std::uint64_t len, std::uint32_t max_chunk, std::uint64_t blocks) noexcept
    : len_(len),
      max_chunk_(max_chunk == 0 ? std::numeric_limits<std::uint32_t>::max() : max_chunk),
      blocks_(blocks),
      per_block_(len == 0 ? 1 : len / max_chunk_ + (len % max_chunk_ != 0 ? 1 : 0)) {}

Chunk ChunkPlan::operator[](std::uint64_t i) const noexcept {
  const std::uint64_t block = i / per_block_;
  const std::uint64_t offset = (i % per_block_) * max_chunk_;
  const std::uint64_t rest = len_ - offset;
  return Chunk{offset, static_cast<std::uint32_t>(rest < max_chunk_ ? rest : max_chunk_), block};
}

}  // namespace corma::verbs
