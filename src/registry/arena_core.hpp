// The state behind an Arena: its registration, the free slices of each size
// class, and the callers waiting for room. Slices hold it (as the owner
// their bytes go back to), so it outlives the Arena handle until the last
// slice is back.
#pragma once

#include "guard_share.hpp"
#include "registry_counters.hpp"

#include <corma/arena.hpp>
#include <corma/detail/completion.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace corma::detail {

class ArenaCore final : public ShareOwner, public std::enable_shared_from_this<ArenaCore> {
 public:
  using AllocateHandler = asio::any_completion_handler<void(Result<RegionGuard>)>;

  /// `whole`: the arena's registration, a whole number of `config.max_slice` chunks.
  ArenaCore(RegionGuard whole, ArenaConfig config);
  ~ArenaCore() override;
  ArenaCore(const ArenaCore&) = delete;
  ArenaCore& operator=(const ArenaCore&) = delete;

  /// Whether `config` can cut an arena of `bytes`; the bytes to register (whole chunks).
  [[nodiscard]] static Result<std::uint64_t> capacity_for(std::size_t bytes, const ArenaConfig& config);

  Result<RegionGuard> allocate(std::size_t bytes);
  void allocate_or_wait(std::size_t bytes, AllocateHandler handler);
  /// The Arena handle went: waiters are answered `shutting_down`.
  void close();

  void give_back(std::uint64_t offset, std::uint64_t len) noexcept override;
  [[nodiscard]] std::weak_ptr<RdmaBackend> backend() const override { return backend_; }

  [[nodiscard]] ArenaStats stats() const;
  [[nodiscard]] const BackendRegion& backend_region() const noexcept { return whole_.backend_region(); }

 private:
  struct Waiter {
    std::size_t bytes = 0;
    Completion<void(Result<RegionGuard>)> completion;
  };

  [[nodiscard]] Result<std::size_t> class_of(std::size_t bytes) const;
  /// A free slice of class `cls`, carving a fresh chunk if it has none; the
  /// slice's offset, or nothing when the arena is full.
  [[nodiscard]] std::optional<std::uint64_t> take_locked(std::size_t cls);
  /// A slice of class `cls` back on its free list.
  void put_back_locked(std::size_t cls, std::uint64_t offset);
  [[nodiscard]] RegionGuard slice_at(std::uint64_t offset, std::size_t bytes);
  void cancel(std::uint64_t ticket);
  [[nodiscard]] asio::any_io_executor early_executor() const;

  RegionGuard whole_;
  RegistryCounters& counters_;  // the registry's: its core lives while `whole_` does
  const ArenaConfig config_;
  const std::uint64_t capacity_;
  const std::weak_ptr<RdmaBackend> backend_;

  mutable std::mutex mutex_;
  std::vector<std::vector<std::uint64_t>> free_;  // offsets, by class
  std::uint64_t carved_ = 0;                      // bytes split into chunks so far
  bool closed_ = false;
  std::uint64_t next_ticket_ = 0;
  std::map<std::uint64_t, Waiter> waiters_;  // in arrival order
  ArenaStats stats_;
};

}  // namespace corma::detail
