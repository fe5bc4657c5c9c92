// Part of a registration that a guard names without owning the whole of it
// (a slice of an arena, or a guard sharing a cached registration): where its
// bytes lie in the registration, the transfers using them, and the event
// that says they went back to their owner. They go back once the guard has
// let go and the last transfer has ended; an operation launched later is
// refused. Taking a slice and giving it back is the hot path of arenas and
// of the cache: the share's state is one atomic word, with no lock.
#pragma once

#include "latch.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace corma::detail {

/// What a share's bytes go back to once nobody uses them: an arena, or a
/// cached registration.
class ShareOwner {
 public:
  virtual ~ShareOwner() = default;
  virtual void give_back(std::uint64_t offset, std::uint64_t len) noexcept = 0;
  /// Whose progress thread answers waiters on the share's events.
  [[nodiscard]] virtual std::weak_ptr<RdmaBackend> backend() const = 0;
  /// What a guard's deregistered() waits for; null: the share's own return
  /// (an arena's slice, whose memory the arena keeps).
  [[nodiscard]] virtual std::shared_ptr<Latch> memory_released() const { return nullptr; }
  /// The guard's async_deregister: the holder wants its memory unregistered.
  virtual void deregistration_asked() {}
};

class GuardShare {
 public:
  GuardShare(std::shared_ptr<ShareOwner> owner, std::uint64_t offset, std::uint64_t len) noexcept
      : owner_(std::move(owner)), offset_(offset), len_(len) {}
  GuardShare(const GuardShare&) = delete;
  GuardShare& operator=(const GuardShare&) = delete;
  ~GuardShare();

  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  [[nodiscard]] std::uint64_t len() const noexcept { return len_; }

  /// Admits one transfer unless the guard has let go.
  [[nodiscard]] bool begin_transfer() noexcept;
  /// Ends one; the last one out after the guard let go gives the bytes back.
  void end_transfer();
  /// The guard is done: the bytes go back now, or when the last transfer ends.
  void let_go();

  /// Set once the bytes are back with their owner (made on first asking).
  [[nodiscard]] std::shared_ptr<Latch> given_back();
  /// What the guard's deregistered() resolves with: when its memory may be
  /// freed or reused.
  [[nodiscard]] std::shared_ptr<Latch> memory_released();
  /// The guard's async_deregister: tells the owner, then lets go.
  void deregister();

 private:
  // The state word: whether the guard still holds the share, whether the
  // bytes went back, and the transfers in flight.
  static constexpr std::uint64_t held_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t returned_bit = std::uint64_t{1} << 62;
  static constexpr std::uint64_t transfers_mask = returned_bit - 1;

  /// From `seen` (held by nobody, no transfer), marks the bytes returned;
  /// true for the one caller that did, who then gives them back.
  bool claim_return(std::uint64_t seen) noexcept;
  /// Gives the bytes back and sets the event, if anyone asked for it.
  void give_back();

  const std::shared_ptr<ShareOwner> owner_;
  const std::uint64_t offset_;
  const std::uint64_t len_;
  std::atomic<std::uint64_t> state_{held_bit};

  // The event is made only when someone asks (rarely, on the hot path).
  std::mutex event_mutex_;
  std::atomic<bool> event_made_{false};
  std::shared_ptr<Latch> given_back_;
};

}  // namespace corma::detail
