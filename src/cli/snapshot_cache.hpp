// Snapshots of served files, kept by name for the next fetch while their
// file and name provably stay as they were (change_watch.hpp), within a
// byte limit. A kept snapshot is found without touching the file system;
// each is read under a read lease (read_lease.hpp), so it is one version.
#pragma once

#include "change_watch.hpp"
#include "file_snapshot.hpp"
#include "snapshot_budget.hpp"

#include <corma/owner.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace corma::cli {

class SnapshotCache {
 public:
  /// How often a file is read again when it was being written before the
  /// fetch is refused with `object_changed`.
  static constexpr int read_attempts = 3;
  /// A look-up trusts what it kept for at most this long without reading
  /// the file system's news (refresh() also brings them in).
  static constexpr std::chrono::microseconds news_interval{1000};

  /// How long a read waits in line for room under the limit, by default,
  /// before it is refused with `budget_exceeded`.
  static constexpr std::chrono::milliseconds default_room_wait{10000};

  /// Snapshots of at most `max_bytes` together; a read that finds them
  /// spent waits up to `room_wait` for room (SnapshotBudget).
  explicit SnapshotCache(std::uint64_t max_bytes, std::chrono::milliseconds room_wait = default_room_wait);

  /// Drops every kept snapshot whose file or name may have changed. A
  /// caller that looks up many names for one request calls it once first:
  /// the look-ups then see every change made before the request.
  void refresh();

  /// The kept snapshot of `name`, while it is provably current.
  std::shared_ptr<const FileSnapshot> find(std::string_view name);

  /// Begins to watch `name` under `root` before its file is opened; false
  /// when it cannot be watched (its snapshot is then not kept).
  bool watch(const std::string& name, const std::filesystem::path& root);
  /// Gives up watching `name` (its snapshot is not to be kept).
  void unwatch(const std::string& name);

  /// A read of one name from the look-up that begins it to finish(); the
  /// look-ups that join it are handed its result.
  /// What a read hands the look-ups that joined it.
  using Joiner = std::function<void(const Result<PublishedObject>&)>;
  struct Reading {
    explicit Reading(std::string n, std::uint64_t i) : name(std::move(n)), id(i) {}
    std::string name;
    std::uint64_t id;             ///< what give_up() names it by
    bool started = false;         ///< the file is being read (read() began)
    bool kept = false;            ///< its snapshot is to be kept (the name is watched)
    bool dropped = false;         ///< a change to the name was seen since it started
    std::size_t wanted = 1;       ///< look-ups that still want its result
    std::atomic<bool> abandoned{false};  ///< none does: the read stops
    std::vector<Joiner> joiners{};  ///< handed its result by finish()
  };
  using Ticket = std::list<Reading>::iterator;

  /// Joins a read of `name` when that is as good as reading it now: a read
  /// that has not begun yet (it will see everything done before this
  /// look-up), or one under way whose snapshot is to be kept and nothing
  /// has changed the name since it began (what refresh() and every change
  /// seen mark). `joiner` is then handed that read's result and true is
  /// returned. Else a read is begun: `ticket` names it, and the caller
  /// reads the file (read()) and ends the read with finish(). So consumers
  /// asking for one cold file at once read it once, within the limit.
  /// `read_id` names the read joined or begun, for give_up().
  bool join_or_begin(const std::string& name, Joiner joiner, Ticket& ticket, std::uint64_t& read_id);
  /// A look-up that joined or began the read `read_id` no longer wants its
  /// result (its acquire was abandoned). When no look-up wants it any more,
  /// the read stops: one not yet started never opens the file, one under
  /// way stops at its next chunk, and what it read is let go.
  void give_up(std::uint64_t read_id);
  /// Begins a read of `name` nobody joins before it starts (for a caller
  /// that reads at once, on its own thread).
  Ticket begin(const std::string& name);

  /// Reads the open file `fd` whole under a read lease, `read_attempts`
  /// times at most while a writer is at work, and keeps the snapshot for
  /// `name` when `name` is being watched (watch()), for the read `ticket`
  /// names. `object_changed` for a file being written throughout;
  /// `not_configured` where no read lease can be had; `budget_exceeded`
  /// when no room under the limit came within the room wait (or the file
  /// is larger than the whole limit); `cancelled` when every look-up gave
  /// the read up (give_up()).
  Result<std::shared_ptr<const FileSnapshot>> read(int fd, const std::string& name, Ticket ticket);

  /// Whether every look-up gave the read `ticket` names up: it need not begin.
  [[nodiscard]] static bool abandoned(Ticket ticket) noexcept {
    return ticket->abandoned.load(std::memory_order_acquire);
  }

  /// Ends the read `ticket` names: its joiners are handed `result` (on
  /// this thread, outside the cache's lock).
  void finish(Ticket ticket, const Result<PublishedObject>& result);

  /// `snapshot` lent to a consumer: when the consumer lets go of it, reads
  /// waiting for room look again (a kept snapshot nobody reads can go).
  [[nodiscard]] PublishedObject lend(std::shared_ptr<const FileSnapshot> snapshot) const;

  /// Bytes held by snapshots, in use or kept.
  [[nodiscard]] std::uint64_t bytes_held() const { return budget_->held(); }
  /// Reads waiting in line for room under the limit.
  [[nodiscard]] std::size_t reads_waiting_for_room() const { return budget_->waiting(); }
  /// Waits up to `limit` until exactly `count` reads wait for room.
  bool wait_for_reads_waiting_for_room(std::size_t count, std::chrono::milliseconds limit) const {
    return budget_->wait_until_waiting(count, limit);
  }

 private:
  struct Kept {
    std::shared_ptr<const FileSnapshot> snapshot;
    std::list<std::string>::iterator recency;
  };
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view name) const noexcept { return std::hash<std::string_view>{}(name); }
  };

  Result<std::shared_ptr<const FileSnapshot>> read_once(int fd, const std::string& name, const Reading& reading);
  /// Gives up kept snapshots nobody reads, least recently used first, until
  /// `size` more bytes fit the limit or none is left (under mutex_; what
  /// goes gives its bytes back to the budget, whose lock comes after it).
  void make_room(std::uint64_t size);
  void drop(const std::string& name);  // under mutex_
  void refresh_locked();              // under mutex_

  std::chrono::milliseconds room_wait_;
  std::shared_ptr<SnapshotBudget> budget_;
  std::mutex mutex_;
  std::optional<ChangeWatch> watch_;  ///< none: nothing is kept
  std::unordered_map<std::string, Kept, NameHash, std::equal_to<>> kept_;
  std::list<std::string> recency_;  ///< least recently used first
  /// The reads begun and not finished, each with whether its name was
  /// dropped since it started (a change seen, or the watch given up): such
  /// a read's snapshot is handed to its look-ups but not kept, since
  /// nothing watches its name any more and a kept snapshot would be served
  /// after the change.
  std::list<Reading> reading_;
  std::uint64_t next_read_id_ = 1;

  std::chrono::steady_clock::time_point refreshed_{};
};

}  // namespace corma::cli
