// Part of a registration that a guard names without owning the whole of it
// (a slice of an arena): where its bytes lie in the registration, the
// transfers using them, and the event that says they went back to their
// owner. They go back once the guard has let go and the last transfer has
// ended; an operation launched later is refused.
#pragma once

#include "latch.hpp"

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
  /// What a guard's deregistered() waits for; null: the share's own return
  /// (an arena's slice, whose memory the arena keeps).
  [[nodiscard]] virtual std::shared_ptr<Latch> memory_released() const { return nullptr; }
  /// The guard's async_deregister: the holder wants its memory unregistered.
  virtual void deregistration_asked() {}
};

class GuardShare {
 public:
  GuardShare(std::shared_ptr<ShareOwner> owner, std::weak_ptr<RdmaBackend> backend, std::uint64_t offset,
             std::uint64_t len) noexcept
      : owner_(std::move(owner)), backend_(std::move(backend)), offset_(offset), len_(len) {}
  GuardShare(const GuardShare&) = delete;
  GuardShare& operator=(const GuardShare&) = delete;
  ~GuardShare();

  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  [[nodiscard]] std::uint64_t len() const noexcept { return len_; }

  /// Admits one transfer unless the guard has let go.
  [[nodiscard]] bool begin_transfer();
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
  /// Gives the bytes back (once: `returned_` was set under the lock) and
  /// sets `latch`, if anyone asked for it.
  void give_back(const std::shared_ptr<Latch>& latch);

  const std::shared_ptr<ShareOwner> owner_;
  const std::weak_ptr<RdmaBackend> backend_;
  const std::uint64_t offset_;
  const std::uint64_t len_;

  std::mutex mutex_;
  bool held_ = true;
  bool returned_ = false;
  std::uint64_t transfers_ = 0;
  std::shared_ptr<Latch> given_back_;
};

}  // namespace corma::detail
