// The shared state behind one RegionGuard: its phase, the transfers in
// flight, and who waits for its release.
#pragma once

#include "latch.hpp"

#include <corma/backend.hpp>
#include <corma/owned_buffer.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace corma::detail {

class RegistryCore;
struct RegistryCounters;

class RegionState : public std::enable_shared_from_this<RegionState> {
 public:
  /// Called once per request with the outcome of the unmap it waited for.
  using DeregistrationListener = std::function<void(const Result<void>&)>;

  RegionState(std::shared_ptr<RegistryCore> core, BackendRegion region, std::span<std::byte> memory,
              std::uint64_t charged, std::uint64_t generation, OwnedBuffer owned);
  RegionState(const RegionState&) = delete;
  RegionState& operator=(const RegionState&) = delete;
  ~RegionState();

  [[nodiscard]] std::span<std::byte> memory() const noexcept { return memory_; }
  [[nodiscard]] const BackendRegion& region() const noexcept { return region_; }
  [[nodiscard]] std::uint64_t charged() const noexcept { return charged_; }
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  [[nodiscard]] const std::shared_ptr<Latch>& deregistered() const noexcept { return deregistered_; }
  [[nodiscard]] const std::shared_ptr<RdmaBackend>& backend() const noexcept;
  /// The registry's counters (its core outlives the region).
  [[nodiscard]] RegistryCounters& counters() const noexcept;

  /// Admits one transfer unless deregistration has begun.
  [[nodiscard]] bool begin_transfer();
  /// Ends one transfer; the last one out starts a pending unmap.
  void end_transfer();

  /// Stops admitting transfers and unmaps once the last one ends. Retries an
  /// unconfirmed unmap. `listener` (may be empty) hears the outcome.
  void request_deregistration(DeregistrationListener listener);

  /// Registry shutdown found the backend holding no registrations: the
  /// memory is free whatever the unmap said.
  void confirm_released_by_shutdown();

  [[nodiscard]] bool released() const;
  /// Its unmap is out with the provider (no transfer left to wait for).
  [[nodiscard]] bool unmapping() const;

  /// Hands back the owned buffer (if any) once the release is confirmed;
  /// before that it stays with the region.
  [[nodiscard]] OwnedBuffer take_owned();

  /// Memory whose release was never confirmed may still be read or written
  /// by the provider: it is parked where it stays reachable, never freed.
  static void quarantine(OwnedBuffer buffer, RegistryCounters& counters);

 private:
  enum class Phase { active, draining, unmapping, unconfirmed, released };

  void start_unmap();
  void on_unmapped(Result<void> outcome);
  /// Marks the region released and tells the registry; call without the lock.
  void finish_release();

  const std::shared_ptr<RegistryCore> core_;
  const BackendRegion region_;
  const std::span<std::byte> memory_;
  const std::uint64_t charged_;
  const std::uint64_t generation_;
  OwnedBuffer owned_;
  const std::shared_ptr<Latch> deregistered_;

  mutable std::mutex mutex_;
  Phase phase_ = Phase::active;
  std::uint64_t transfers_in_flight_ = 0;
  std::vector<DeregistrationListener> listeners_;
};

}  // namespace corma::detail
