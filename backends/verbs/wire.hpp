// The verbs backend's own wire records, versioned and fixed-size, checked
// byte for byte before anything reaches the provider:
// - the packed key: rkey, registered address, length and access, and a
//   checksum;
// - the peer blob: what one side of an RC connection tells the other.
#pragma once

#include <corma/backend.hpp>
#include <corma/error.hpp>

#include <array>
#include <cstdint>
#include <vector>

namespace corma::verbs::wire {

struct RemoteKey {
  std::uint32_t rkey = 0;
  std::uint64_t addr = 0;
  std::uint64_t len = 0;
  /// What the owner registered the range for: lets the initiator refuse an
  /// atomic on a region without Access::remote_atomic before the NIC would.
  Access access = Access::remote_read;
};

[[nodiscard]] PackedKey encode_key(const RemoteKey& key);
/// `invalid_key` for anything encode_key did not produce, an empty or
/// wrapping range, or an access that exposes nothing.
[[nodiscard]] Result<RemoteKey> decode_key(const PackedKey& key);

/// One side of an RC connection: its queue pair and how to address it.
struct QpEndpoint {
  std::uint32_t qp_num = 0;  ///< 24 bits
  std::uint32_t psn = 0;     ///< 24 bits: the first packet sequence number it sends
  std::uint16_t lid = 0;
  std::array<std::uint8_t, 16> gid{};
  bool has_gid = false;      ///< RoCE / routed IB: address by GID
  std::uint16_t mtu = 0;     ///< bytes: 256 ... 4096
  friend bool operator==(const QpEndpoint&, const QpEndpoint&) = default;
};

[[nodiscard]] std::vector<std::byte> encode_endpoint(const QpEndpoint& endpoint);
/// `protocol` for anything encode_endpoint did not produce, or values no
/// queue pair can have (24-bit fields out of range, an unknown MTU).
[[nodiscard]] Result<QpEndpoint> decode_endpoint(const std::vector<std::byte>& blob);

}  // namespace corma::verbs::wire
