// The rendezvous descriptor: the only thing a consumer needs to read an
// owner's bytes, as a versioned little-endian binary record.
#pragma once

#include <corma/backend.hpp>
#include <corma/error.hpp>
#include <corma/region_guard.hpp>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace corma {

/// Layout (little-endian, no padding):
///   u8  version            (descriptor_version)
///   u8  backend            (the owner backend's BackendId; never 0)
///   u16 flags              (reserved: must be 0)
///   u64 generation
///   u64 remote address
///   u64 length             (> 0)
///   u32 packed-key length  (<= max_packed_key_size, == the bytes that follow)
///   packed key
struct Descriptor {
  static constexpr std::uint8_t descriptor_version = 1;
  static constexpr std::size_t header_size = 1 + 1 + 2 + 8 + 8 + 8 + 4;

  BackendId backend{};
  std::uint64_t generation = 0;
  std::uint64_t addr = 0;
  std::uint64_t len = 0;
  PackedKey packed_key;

  friend bool operator==(const Descriptor&, const Descriptor&) = default;
};

[[nodiscard]] std::vector<std::byte> encode(const Descriptor& descriptor);

/// Strict: an unknown version, no backend, non-zero flags, zero length, a key
/// length that disagrees with the bytes, an oversized key, or trailing bytes
/// are refused (`protocol`, or `invalid_key` for the key itself). Which
/// backend ids exist is the backends' business: a descriptor for another
/// backend than the reader's is refused when it is used (`invalid_key`).
[[nodiscard]] Result<Descriptor> decode_descriptor(std::span<const std::byte> bytes);

/// The descriptor of a registered region.
[[nodiscard]] Result<Descriptor> describe(const RemoteRegion& region);
/// What a consumer hands to RegionGuard::async_get.
[[nodiscard]] RemoteRegion to_remote_region(const Descriptor& descriptor);

}  // namespace corma
