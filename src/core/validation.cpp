#include <corma/backend.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace corma {

Result<void> validate_range(const void* ptr, std::size_t len) {
  if (ptr == nullptr) return fail(errc::out_of_range, "null pointer");
  if (len == 0) return fail(errc::out_of_range, "zero length");
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  if (len - 1 > std::numeric_limits<std::uintptr_t>::max() - start) {
    return fail(errc::out_of_range, "range wraps around the address space");
  }
  return success();
}

Result<void> validate_slice(std::uint64_t offset, std::uint64_t len, std::uint64_t region_len) {
  if (len == 0) return fail(errc::out_of_range, "zero length");
  if (offset > region_len || len > region_len - offset) {
    return fail(errc::out_of_range, "offset " + std::to_string(offset) + " + length " +
                                        std::to_string(len) + " exceeds the region's " +
                                        std::to_string(region_len) + " bytes");
  }
  return success();
}

namespace {

constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

/// `base + (blocks - 1) * stride` does not overflow.
bool last_block_fits(std::uint64_t base, std::uint64_t blocks, std::uint64_t stride) {
  const std::uint64_t steps = blocks - 1;
  return stride == 0 || (steps <= u64_max / stride && base <= u64_max - steps * stride);
}

Result<void> validate_blocks(const TransferRequest& r) {
  if (r.len == 0) return fail(errc::out_of_range, "zero-length transfer");
  if (r.blocks == 1) return success();
  if (r.blocks == 0) return fail(errc::out_of_range, "a transfer of zero blocks");
  if (r.blocks > max_transfer_blocks) {
    return fail(errc::out_of_range, "a transfer of " + std::to_string(r.blocks) + " blocks; at most " +
                                        std::to_string(max_transfer_blocks));
  }
  if (r.local_stride < r.len || r.remote_stride < r.len) {
    return fail(errc::out_of_range, "a stride shorter than its block: blocks would overlap");
  }
  if (!last_block_fits(r.local_offset, r.blocks, r.local_stride) ||
      !last_block_fits(r.remote_addr, r.blocks, r.remote_stride)) {
    return fail(errc::out_of_range, "the last block's offset overflows");
  }
  return success();
}

}  // namespace

Result<void> validate_local_range(const TransferRequest& request, std::uint64_t region_len) {
  CORMA_TRY(validate_blocks(request));
  CORMA_TRY(validate_slice(request.local_offset, request.len, region_len));
  // Blocks only go up: the first and the last inside, all are.
  if (request.blocks > 1) {
    CORMA_TRY(validate_slice(request.local_offset_of(request.blocks - 1), request.len, region_len));
  }
  return success();
}

Result<void> validate_remote_range(bool is_put, const TransferRequest& request, std::uint64_t key_addr,
                                   std::uint64_t key_len, Access key_access) {
  if (request.remote_addr < key_addr) return fail(errc::out_of_range, "remote address below the key's range");
  CORMA_TRY(validate_slice(request.remote_addr - key_addr, request.len, key_len));
  if (request.blocks > 1) {
    CORMA_TRY(validate_slice(request.remote_addr_of(request.blocks - 1) - key_addr, request.len, key_len));
  }
  if (is_put && !access_allows(key_access, Access::remote_read_write)) {
    return fail(errc::not_owned, "the key's region takes no puts (registered without remote write)");
  }
  return success();
}

Result<void> validate_atomic_word(std::uint64_t remote_addr, std::uint64_t region_addr, std::uint64_t region_len,
                                  Access region_access) {
  if (remote_addr % atomic_word_size != 0) {
    return fail(errc::out_of_range, "an atomic's word must be 8-byte aligned");
  }
  if (remote_addr < region_addr) return fail(errc::out_of_range, "the atomic's word is below the key's region");
  CORMA_TRY(validate_slice(remote_addr - region_addr, atomic_word_size, region_len));
  if (!access_allows(region_access, Access::remote_atomic)) {
    return fail(errc::not_owned, "the region is not registered for remote atomics");
  }
  return success();
}

Result<void> validate_batch_size(std::size_t size) {
  if (size > max_batch_size) {
    return fail(errc::out_of_range, "batch of " + std::to_string(size) + " transfers is longer than " +
                                        std::to_string(max_batch_size));
  }
  return success();
}

}  // namespace corma
