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

Result<void> validate_batch_size(std::size_t size) {
  if (size > max_batch_size) {
    return fail(errc::out_of_range, "batch of " + std::to_string(size) + " transfers is longer than " +
                                        std::to_string(max_batch_size));
  }
  return success();
}

}  // namespace corma
