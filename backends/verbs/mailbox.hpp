// A peer's message buffers: where the notifications and acknowledgements
// exchanged over its queue pair land and leave from. One registered block
// per peer, cut into fixed slots: the receive queue's buffers, the
// notifications' send buffers and the acknowledgements' send buffers.
//
// The credit scheme (docs/backends.md, "Notifications") lives in these
// sizes: a side has at most `window` notifications to a peer unacknowledged,
// and every acknowledgement answers one notification, so the messages that
// may be sitting in one side's receive queue at once are the peer's
// `window` notifications plus the acknowledgements of its own `window`:
// `receive_depth` receives, always posted, never an RNR NAK.
#pragma once

#include "owned.hpp"

#include <corma/error.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace corma::verbs {

class Mailbox {
 public:
  /// Notifications a side may have sent to one peer and not yet had
  /// acknowledged; more wait in the peer's backlog.
  static constexpr std::uint32_t window = 8;
  /// Receives each queue pair keeps posted: the peer's window of
  /// notifications plus the acknowledgements of this side's.
  static constexpr std::uint32_t receive_depth = 2 * window;
  /// Acknowledgements that may be posted and not yet completed at once;
  /// more wait for a slot (their receives are reposted only once they go).
  static constexpr std::uint32_t ack_slots = receive_depth;
  /// Every slot's size: room for the largest message (21 bytes) with some
  /// to spare, so that a slightly longer one from a confused peer still
  /// lands (and is dropped by size) instead of failing the queue pair.
  static constexpr std::uint32_t slot_size = 64;

  Mailbox() = default;

  /// Allocates and registers (local write only) a peer's block in `pd`.
  [[nodiscard]] static Result<Mailbox> create(const IbvApi& api, ibv_pd* pd);

  /// The scatter/gather entry of receive slot `slot` (< receive_depth).
  [[nodiscard]] ibv_sge receive_sge(std::uint32_t slot) const;
  /// What a completed receive brought: the first `len` bytes of its slot,
  /// or nothing when `len` does not fit in a slot.
  [[nodiscard]] std::optional<std::span<const std::byte>> received(std::uint32_t slot, std::uint32_t len) const;

  /// A notification's send slot: one is always free while the window has
  /// room, since a notification holds its slot only until its send
  /// completes and its place in the window until it is acknowledged.
  [[nodiscard]] std::uint32_t take_notify_slot();
  /// An acknowledgement's send slot, if one is free.
  [[nodiscard]] std::optional<std::uint32_t> take_ack_slot();
  /// Gives back a send slot taken by either.
  void give_back(std::uint32_t send_slot);
  /// Copies `bytes` (at most slot_size) into send slot `send_slot`; the
  /// scatter/gather entry that sends them.
  [[nodiscard]] ibv_sge fill(std::uint32_t send_slot, std::span<const std::byte> bytes);

 private:
  static constexpr std::uint32_t send_slots = window + ack_slots;

  std::vector<std::byte> bytes_;  // receive_depth receive slots, then the send slots
  OwnedMr mr_;
  std::vector<std::uint32_t> free_notify_;  // send slots [0, window)
  std::vector<std::uint32_t> free_ack_;     // send slots [window, send_slots)
};

// Work request ids. A receive (on the receive CQ) and an acknowledgement
// (on the send CQ) are named by their slot, below 2^32; a notification,
// like a transfer, by its transfer-table id, which never is (its high half,
// the table slot's use count, starts at 1 and skips 0:
// backend_kit/transfer_table.hpp).
[[nodiscard]] constexpr std::uint64_t slot_wr_id(std::uint32_t slot) noexcept { return slot; }
[[nodiscard]] constexpr bool is_slot_wr(std::uint64_t wr_id) noexcept { return (wr_id >> 32) == 0; }
[[nodiscard]] constexpr std::uint32_t slot_of(std::uint64_t wr_id) noexcept { return static_cast<std::uint32_t>(wr_id); }

}  // namespace corma::verbs
