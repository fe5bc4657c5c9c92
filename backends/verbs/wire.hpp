// The verbs backend's own wire records, versioned and fixed-size, checked
// byte for byte before anything reaches the provider:
// - the packed key: rkey, registered address, length and access, and a
//   checksum;
// - the peer blob: what one side of an RC connection tells the other;
// - the two messages sent over a connection: a notification and its
//   acknowledgement (docs/backends.md, "Notifications").
#pragma once

#include <corma/backend.hpp>
#include <corma/error.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

namespace corma::verbs::wire {

struct RemoteKey {
  std::uint32_t rkey = 0;
  std::uint64_t addr = 0;
  std::uint64_t len = 0;
  /// What the owner registered the range for: lets the initiator refuse an
  /// atomic on a region without Access::remote_atomic, or a put on one
  /// without remote write, before the NIC would.
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

/// A notification (`CVN1`): the tag, and the sender's sequence number, which
/// the acknowledgement names.
struct NotifyMessage {
  std::uint64_t sequence = 0;
  std::uint64_t tag = 0;
  friend bool operator==(const NotifyMessage&, const NotifyMessage&) = default;
};

/// What became of a notification at its target.
enum class NotifyStatus : std::uint8_t {
  queued = 0,
  queue_full = 1,     ///< the target's queue was full: not delivered
  not_accepted = 2,   ///< the target closed this peer: dropped and counted
  shutting_down = 3,  ///< the target is shutting down: not delivered
};

/// The target's acknowledgement of a notification (`CVR1`).
struct AckMessage {
  std::uint64_t sequence = 0;
  NotifyStatus status = NotifyStatus::queued;
  friend bool operator==(const AckMessage&, const AckMessage&) = default;
};

using Message = std::variant<NotifyMessage, AckMessage>;

inline constexpr std::size_t notify_message_size = 21;
inline constexpr std::size_t ack_message_size = 14;

[[nodiscard]] std::vector<std::byte> encode_message(const Message& message);
/// `protocol` for anything encode_message did not produce: a size other
/// than the record's, another magic or version, an unknown status.
[[nodiscard]] Result<Message> decode_message(std::span<const std::byte> bytes);

}  // namespace corma::verbs::wire
