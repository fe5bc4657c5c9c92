#include "snapshot_cache.hpp"

#include "read_lease.hpp"

#include <sys/stat.h>

#include <algorithm>

namespace corma::cli {

SnapshotCache::SnapshotCache(std::uint64_t max_bytes, std::chrono::milliseconds room_wait)
    : room_wait_(room_wait), budget_(std::make_shared<SnapshotBudget>(max_bytes)) {
  // Without inotify nothing is kept: every fetch reads its file again.
  if (auto watch = ChangeWatch::create()) watch_.emplace(std::move(watch).value());
}

void SnapshotCache::refresh() {
  std::lock_guard lock(mutex_);
  refresh_locked();
}

void SnapshotCache::refresh_locked() {
  refreshed_ = std::chrono::steady_clock::now();
  if (!watch_) return;
  for (const auto& name : watch_->changed()) drop(name);
}

std::shared_ptr<const FileSnapshot> SnapshotCache::find(std::string_view name) {
  std::lock_guard lock(mutex_);
  if (kept_.empty()) return nullptr;
  if (std::chrono::steady_clock::now() - refreshed_ > news_interval) refresh_locked();
  auto it = kept_.find(name);
  if (it == kept_.end()) return nullptr;
  recency_.splice(recency_.end(), recency_, it->second.recency);  // most recently used last
  return it->second.snapshot;
}

bool SnapshotCache::watch(const std::string& name, const std::filesystem::path& root) {
  std::lock_guard lock(mutex_);
  drop(name);
  return watch_ && watch_->watch_name(name, root, name);
}

void SnapshotCache::unwatch(const std::string& name) {
  std::lock_guard lock(mutex_);
  drop(name);
}

void SnapshotCache::drop(const std::string& name) {
  for (auto& read : reading_) read.dropped = read.dropped || read.name == name;
  if (watch_) watch_->forget(name);
  auto it = kept_.find(name);
  if (it == kept_.end()) return;
  recency_.erase(it->second.recency);
  kept_.erase(it);  // its readers keep their own reference
}

void SnapshotCache::make_room(std::uint64_t size) {
  for (auto it = recency_.begin(); it != recency_.end() && budget_->held() + size > budget_->limit();) {
    const std::string name = *it++;
    if (kept_.at(name).snapshot.use_count() == 1) drop(name);  // nobody reads it
  }
}

bool SnapshotCache::join_or_begin(const std::string& name, Joiner joiner, Ticket& ticket, std::uint64_t& read_id) {
  std::lock_guard lock(mutex_);
  // The news first: a change made before this look-up marks the read it
  // would join (the same freshness as a kept snapshot's, find()).
  if (std::chrono::steady_clock::now() - refreshed_ > news_interval) refresh_locked();
  for (auto it = reading_.rbegin(); it != reading_.rend(); ++it) {
    if (it->name != name || it->wanted == 0 || (it->started && (!it->kept || it->dropped))) continue;
    it->joiners.push_back(std::move(joiner));
    ++it->wanted;
    read_id = it->id;
    return true;
  }
  ticket = reading_.emplace(reading_.end(), name, next_read_id_++);
  read_id = ticket->id;
  return false;
}

SnapshotCache::Ticket SnapshotCache::begin(const std::string& name) {
  std::lock_guard lock(mutex_);
  return reading_.emplace(reading_.end(), name, next_read_id_++);
}

void SnapshotCache::give_up(std::uint64_t read_id) {
  {
    std::lock_guard lock(mutex_);
    auto read = std::find_if(reading_.begin(), reading_.end(), [&](const Reading& r) { return r.id == read_id; });
    if (read == reading_.end() || read->wanted == 0 || --read->wanted != 0) return;
    read->abandoned.store(true, std::memory_order_release);
  }
  budget_->nudge();  // a read waiting in line for room leaves it
}

PublishedObject SnapshotCache::lend(std::shared_ptr<const FileSnapshot> snapshot) const {
  const auto bytes = snapshot->bytes();
  const auto* data = snapshot.get();
  // Lent under a keepalive of its own each time, to hear when each lending
  // ends; every lending of one snapshot is still one version of the file.
  std::shared_ptr<const void> version = snapshot;
  std::shared_ptr<const void> lent(data, [snapshot = std::move(snapshot), budget = budget_](const void*) mutable {
    snapshot.reset();
    budget->nudge();
  });
  return PublishedObject{bytes, std::move(lent), std::move(version)};
}

void SnapshotCache::finish(Ticket ticket, const Result<PublishedObject>& result) {
  std::vector<Joiner> joiners;
  {
    std::lock_guard lock(mutex_);
    joiners = std::move(ticket->joiners);
    reading_.erase(ticket);
  }
  // Outside the lock: a joiner may look the cache up again.
  for (auto& joiner : joiners) joiner(result);
}

Result<std::shared_ptr<const FileSnapshot>> SnapshotCache::read(int fd, const std::string& name, Ticket reading) {
  bool keep = false;
  {
    std::lock_guard lock(mutex_);
    // The file watch goes on before the lease is taken: from the moment the
    // snapshot is proven whole, every open of the file is seen. What
    // changed before now is in what this read sees.
    keep = watch_ && watch_->watch_file(name, fd);
    reading->started = true;
    reading->kept = keep;
    reading->dropped = false;
  }
  for (int attempt = 1;; ++attempt) {
    auto snapshot = read_once(fd, name, *reading);
    if (snapshot && keep) {
      std::lock_guard lock(mutex_);
      if (!reading->dropped) {
        recency_.push_back(name);
        kept_.insert_or_assign(name, Kept{snapshot.value(), std::prev(recency_.end())});
      }
    }
    if (snapshot || !snapshot.error().is(errc::object_changed) || attempt == read_attempts ||
        abandoned(reading)) {
      if (!snapshot) unwatch(name);
      if (!snapshot && snapshot.error().is(errc::object_changed)) {
        return fail(errc::object_changed, "'" + name + "' was being written each of " + std::to_string(read_attempts) +
                                              " times it was read (" + snapshot.error().detail +
                                              "); publish files by renaming a finished file over the name");
      }
      return snapshot;
    }
  }
}

Result<std::shared_ptr<const FileSnapshot>> SnapshotCache::read_once(int fd, const std::string& name,
                                                                     const Reading& reading) {
  // Room first, without the lease: a read lease held while waiting in line
  // would hold up a writer's open for as long.
  struct stat info {};
  if (::fstat(fd, &info) != 0) return fail(errc::region_not_found, "cannot stat '" + name + "'");
  const auto size = static_cast<std::uint64_t>(info.st_size);
  const auto make_room_for = [this](std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    make_room(bytes);
  };
  if (auto room = budget_->take(size, make_room_for, reading.abandoned, room_wait_); !room) {
    return boost::outcome_v2::failure(Error{room.error().code, "serving '" + name + "': " + room.error().detail});
  }
  auto snapshot = std::make_shared<FileSnapshot>(size, budget_);
  CORMA_TRY(auto lease, ReadLease::take(fd, name));
  // The size again under the lease: nobody can change it now.
  if (::fstat(fd, &info) != 0) return fail(errc::region_not_found, "cannot stat '" + name + "'");
  if (static_cast<std::uint64_t>(info.st_size) != size) {
    return fail(errc::object_changed, "its size changed while it waited for room");
  }
  CORMA_TRY(read_into(fd, snapshot->bytes(), name, &reading.abandoned));
  if (!lease.intact()) return fail(errc::object_changed, "it was opened for writing while it was read");
  return std::shared_ptr<const FileSnapshot>(std::move(snapshot));
}

}  // namespace corma::cli
