// The UCX backend's own wire records: packed keys and peer set-up blobs.
// Everything from a peer is checked here, before any byte reaches UCX
// (ucp_ep_rkey_unpack and ucp_ep_create take no length). A target never
// hands a peer's bytes to UCX at all: the offer it accepts is corma's own
// record and carries no worker address (the peer that reads connects).
#pragma once

#include <corma/backend.hpp>
#include <corma/error.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace corma::ucx::wire {

/// A packed key after validation: the registered range and UCX's rkey
/// buffer, copied into zero-padded storage so that even a misparse by UCX
/// stays inside memory we own.
struct RemoteKey {
  std::uint64_t addr = 0;
  std::uint64_t len = 0;
  Access access = Access::remote_read;  ///< what the owner registered it for
  std::vector<std::byte> rkey;  ///< rkey bytes followed by zero padding
  std::size_t rkey_size = 0;    ///< the rkey's own length
  std::uint64_t md_map = 0;
};

/// Wraps UCX's rkey buffer with the registered range, its access and a
/// checksum.
[[nodiscard]] PackedKey encode_key(std::uint64_t addr, std::uint64_t len, Access access,
                                   std::span<const std::byte> rkey);

/// Refuses anything that is not exactly what encode_key produced with a
/// well-formed UCX rkey whose memory domains are among `local_md_map`.
[[nodiscard]] Result<RemoteKey> decode_key(const PackedKey& key, std::uint64_t local_md_map);

/// Checks the structure of a UCX 1.13 packed rkey: md_map (8 bytes), memory
/// type (1 byte, host), then one (size, bytes) record per md_map bit.
[[nodiscard]] Result<std::uint64_t> check_rkey_structure(std::span<const std::byte> rkey);

/// The initiator's peer offer: magic and version only. The initiator is the
/// side that reads, so it connects; the target needs nothing from it.
[[nodiscard]] std::vector<std::byte> encode_offer();

/// Refuses anything but exactly what encode_offer produces (`protocol`).
[[nodiscard]] Result<void> decode_offer(const std::vector<std::byte>& blob);

/// The target's answer: its worker address framed with its length, and the
/// token the initiator's notifications carry, by which the target knows
/// them to come from a peer it accepted.
[[nodiscard]] std::vector<std::byte> encode_address(std::uint64_t token, std::span<const std::byte> address);

struct PeerAddress {
  std::uint64_t token = 0;
  std::vector<std::byte> address;  ///< zero-padded, for the same reason as keys
};

/// The token and worker address inside an answer.
[[nodiscard]] Result<PeerAddress> decode_address(const std::vector<std::byte>& blob);

/// A notification's active-message header: the token the target gave, the
/// tag, and the sender's sequence number its acknowledgement names.
struct NotifyHeader {
  std::uint64_t token = 0;
  std::uint64_t tag = 0;
  std::uint64_t sequence = 0;
};
/// The target's acknowledgement: the sequence and what became of it.
struct NotifyAck {
  std::uint64_t sequence = 0;
  std::uint64_t status = 0;  ///< one of the NotifyStatus values
};
enum class NotifyStatus : std::uint64_t { queued = 0, queue_full = 1, not_accepted = 2, shutting_down = 3 };

[[nodiscard]] std::vector<std::byte> encode_notify(const NotifyHeader& header);
/// Exactly 24 bytes, or `protocol`.
[[nodiscard]] Result<NotifyHeader> decode_notify(std::span<const std::byte> bytes);
[[nodiscard]] std::vector<std::byte> encode_ack(const NotifyAck& ack);
/// Exactly 16 bytes with a known status, or `protocol`.
[[nodiscard]] Result<NotifyAck> decode_ack(std::span<const std::byte> bytes);

}  // namespace corma::ucx::wire
