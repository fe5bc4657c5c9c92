// Serves the files under one directory, read-only, by relative path. Nothing
// that resolves outside the directory (.., absolute paths, symlinks) is ever
// opened, and a name that is not a plain relative path is refused before it
// reaches the file system. A file is served from a snapshot of one version
// of it (snapshot_cache.hpp), never from a mapping.
#pragma once

#include <corma/owner.hpp>

#include <boost/asio/any_io_executor.hpp>

#include "snapshot_cache.hpp"

#include <filesystem>
#include <memory>

namespace corma::cli {

/// Whether `name` is a path a served directory answers to: components
/// separated by single '/', none empty, "." or ".." (so no leading or
/// trailing '/'), and no byte the protocol refuses in a name. Each file has
/// exactly one such name (without symlinks), so no two strings alias it by
/// accident. `not_owned` otherwise.
Result<void> check_served_name(std::string_view name);

class FileResolver {
 public:
  /// Snapshots alive at once hold at most this many bytes by default.
  static constexpr std::uint64_t default_snapshot_limit = std::uint64_t{1} << 30;

  /// Fails when `root` is not a directory. A read that finds the snapshot
  /// limit spent waits in line up to `room_wait` for room (SnapshotBudget).
  static Result<FileResolver> create(const std::filesystem::path& root,
                                     std::uint64_t snapshot_limit = default_snapshot_limit,
                                     std::chrono::milliseconds room_wait = SnapshotCache::default_room_wait);

  /// A snapshot of the file's current version (shared with every lease that
  /// reads the same version). `not_owned` for a name check_served_name()
  /// refuses or that leads outside the root; `region_not_found` for a
  /// missing file; `object_changed` for a file being written (see
  /// SnapshotCache::read); `budget_exceeded` when no room under the
  /// snapshot limit came within the room wait.
  Result<PublishedObject> operator()(std::string_view name) const;

  /// The same answer without blocking the caller (an AsyncObjectResolver,
  /// for Owner::set_resolver): a kept snapshot is answered at once; a file
  /// to read is read on `readers` (a small pool of file threads), so that
  /// the owner's event loop goes on serving others while a large or cold
  /// file is read. `done` is completed on its associated executor.
  void resolve(std::string name, const boost::asio::any_io_executor& readers, ResolveHandler done) const;

  /// Brings the kept snapshots up to date with the file system: call it
  /// once before the names of one request are resolved (the Owner's
  /// refresh hook), and each name sees every change made before the request.
  void refresh() const { snapshots_->refresh(); }

  /// Bytes held by snapshots, in use or kept for the next fetch.
  [[nodiscard]] std::uint64_t snapshot_bytes() const { return snapshots_->bytes_held(); }
  /// Reads waiting in line for room under the snapshot limit.
  [[nodiscard]] std::size_t reads_waiting_for_room() const { return snapshots_->reads_waiting_for_room(); }
  /// Waits up to `limit` until exactly `count` reads wait for room.
  bool wait_for_reads_waiting_for_room(std::size_t count, std::chrono::milliseconds limit) const {
    return snapshots_->wait_for_reads_waiting_for_room(count, limit);
  }

  [[nodiscard]] const std::filesystem::path& root() const noexcept { return root_; }

 private:
  FileResolver(std::filesystem::path root, std::uint64_t snapshot_limit, std::chrono::milliseconds room_wait)
      : root_(std::move(root)), snapshots_(std::make_shared<SnapshotCache>(snapshot_limit, room_wait)) {}
  /// Reads `name` for the read `ticket` names, then ends that read (its
  /// joiners are handed the result too).
  Result<PublishedObject> read_as(const std::string& name, SnapshotCache::Ticket ticket) const;
  Result<PublishedObject> read(const std::string& name, SnapshotCache::Ticket ticket) const;

  std::filesystem::path root_;  // canonical
  std::shared_ptr<SnapshotCache> snapshots_;  // shared by copies of the resolver
};

}  // namespace corma::cli
