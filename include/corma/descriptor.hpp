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

/// A descriptor is a RemoteRegion (region_guard.hpp) on the wire.
/// Layout (little-endian, no padding):
///   u8  version            (descriptor_version)
///   u8  backend            (the owner backend's BackendId; never 0)
///   u16 flags              (reserved: must be 0)
///   u64 generation
///   u64 remote address
///   u64 length             (> 0)
///   u32 packed-key length  (<= max_packed_key_size, == the bytes that follow)
///   packed key
inline constexpr std::uint8_t descriptor_version = 1;
inline constexpr std::size_t descriptor_header_size = 1 + 1 + 2 + 8 + 8 + 8 + 4;

/// The region's descriptor, unchecked: describe() refuses what a consumer
/// would refuse; this writes whatever it is given (tests and tools forge
/// bad records with it).
[[nodiscard]] std::vector<std::byte> encode(const RemoteRegion& region);

/// Strict: an unknown version, no backend, non-zero flags, zero length, a key
/// length that disagrees with the bytes, an oversized key, or trailing bytes
/// are refused (`protocol`, or `invalid_key` for the key itself). Which
/// backend ids exist is the backends' business: a descriptor for another
/// backend than the reader's is refused when it is used (`invalid_key`).
[[nodiscard]] Result<RemoteRegion> decode_descriptor(std::span<const std::byte> bytes);

/// The descriptor of a registered region, refusing what every consumer
/// would refuse: no backend (`not_configured`), zero length
/// (`out_of_range`), an empty or oversized key (`invalid_key`).
[[nodiscard]] Result<std::vector<std::byte>> describe(const RemoteRegion& region);

}  // namespace corma
