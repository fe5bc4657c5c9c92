#include "file_resolver.hpp"

#include <corma/rendezvous.hpp>

#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace corma::cli {

namespace fs = std::filesystem;

Result<void> check_served_name(std::string_view name) {
  CORMA_TRY(check_object_name(name));
  for (std::size_t start = 0; start <= name.size();) {
    auto end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    const auto part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return fail(errc::not_owned, "'" + std::string(name) +
                                       "' is not served: names are plain relative paths (no empty, '.' or '..' component)");
    }
    start = end + 1;
  }
  return success();
}

Result<FileResolver> FileResolver::create(const fs::path& root, std::uint64_t snapshot_limit,
                                          std::chrono::milliseconds room_wait) {
  std::error_code ec;
  auto canonical = fs::canonical(root, ec);
  if (ec || !fs::is_directory(canonical, ec)) {
    return fail(errc::not_configured, "serve root '" + root.string() + "' is not a directory");
  }
  return FileResolver(std::move(canonical), snapshot_limit, room_wait);
}

namespace {

/// True when `path` is `root` itself or below it.
bool is_inside(const fs::path& root, const fs::path& path) {
  auto r = root.begin();
  auto p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (p == path.end() || *r != *p) return false;
  }
  return true;
}

/// Closes a descriptor when it goes out of scope.
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<PublishedObject> FileResolver::operator()(std::string_view name) const {
  CORMA_TRY(check_served_name(name));
  // read_as() serves a kept snapshot first.
  const std::string owned(name);
  return read_as(owned, snapshots_->begin(owned));
}

namespace {

/// Completes `done` with `found` on the handler's own executor, or, for a
/// handler without one, on `readers` (the executor the caller gave).
void complete(ResolveHandler done, Result<PublishedObject> found, const boost::asio::any_io_executor& readers) {
  const auto executor = boost::asio::get_associated_executor(done, readers);
  boost::asio::dispatch(executor, [done = std::move(done), found = std::move(found)]() mutable {
    std::move(done)(std::move(found));
  });
}

/// One look-up waiting for a read, answered exactly once: by the read, or
/// `cancelled` by its caller's cancellation, whichever comes first.
class WaitingLookup {
 public:
  WaitingLookup(ResolveHandler done, boost::asio::any_io_executor readers)
      : done_(std::move(done)), readers_(std::move(readers)) {}

  /// False when it was answered already.
  bool answer(const Result<PublishedObject>& found) {
    if (answered_.exchange(true, std::memory_order_acq_rel)) return false;
    complete(std::move(done_), found, readers_);
    return true;
  }

 private:
  ResolveHandler done_;
  boost::asio::any_io_executor readers_;
  std::atomic<bool> answered_{false};
};

}  // namespace

void FileResolver::resolve(std::string name, const boost::asio::any_io_executor& readers, ResolveHandler done) const {
  if (auto valid = check_served_name(name); !valid) return complete(std::move(done), std::move(valid).error(), readers);
  if (auto kept = snapshots_->find(name)) {
    return complete(std::move(done), snapshots_->lend(std::move(kept)), readers);
  }
  auto slot = boost::asio::get_associated_cancellation_slot(done);
  auto lookup = std::make_shared<WaitingLookup>(std::move(done), readers);
  // Consumers asking for one file at once share one read of it (a read
  // that has not begun, or one under way while nothing changed the name):
  // a cold file is read once, not once per consumer.
  const SnapshotCache::Joiner joiner = [lookup](const Result<PublishedObject>& found) { lookup->answer(found); };
  SnapshotCache::Ticket ticket;
  std::uint64_t read_id = 0;
  const bool joined = snapshots_->join_or_begin(name, joiner, ticket, read_id);
  if (slot.is_connected()) {
    // The acquire was abandoned (its connection went): answered at once,
    // and the read stops when no other look-up wants it.
    slot.assign([lookup, snapshots = snapshots_, read_id](boost::asio::cancellation_type) {
      if (lookup->answer(fail(errc::cancelled, "the look-up was abandoned"))) snapshots->give_up(read_id);
    });
  }
  if (joined) return;
  boost::asio::post(readers, [files = *this, name = std::move(name), joiner, ticket]() {
    joiner(files.read_as(name, ticket));
  });
}

Result<PublishedObject> FileResolver::read_as(const std::string& name, SnapshotCache::Ticket ticket) const {
  Result<PublishedObject> found = fail(errc::backend, "reading '" + name + "' failed");
  try {
    // A look-up that waited for a file thread may find the file read
    // meanwhile, or nobody waiting for it any more.
    if (SnapshotCache::abandoned(ticket)) {
      found = fail(errc::cancelled, "nobody wants '" + name + "' any more");
    } else if (auto kept = snapshots_->find(name)) {
      found = snapshots_->lend(std::move(kept));
    } else {
      found = read(name, ticket);
    }
  } catch (const std::exception& e) {
    found = fail(errc::backend, "reading '" + name + "' failed: " + e.what());
  }
  // Whatever it came to, the look-ups that joined the read are told.
  snapshots_->finish(ticket, found);
  return found;
}

Result<PublishedObject> FileResolver::read(const std::string& name, SnapshotCache::Ticket ticket) const {
  // Watched before anything is opened, so that nothing that happens to the
  // name from here on goes unseen while its snapshot is kept.
  const bool watched = snapshots_->watch(name, root_);
  std::error_code ec;
  // Resolves every symlink: whatever the name says, the real file must be
  // under the root.
  const auto real = fs::canonical(root_ / name, ec);
  if (ec || !is_inside(root_, real)) {
    snapshots_->unwatch(name);
    if (ec) return fail(errc::region_not_found, "no file '" + name + "'");
    return fail(errc::not_owned, "'" + name + "' leads outside the root");
  }
  // A name that goes through a symlink is served but its snapshot not
  // kept: the watches follow names, not where links lead.
  if (watched && real != root_ / name) snapshots_->unwatch(name);

  // O_NOFOLLOW on the resolved path: a symlink swapped in after the check is refused.
  const Descriptor file{::open(real.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)};
  struct stat info {};
  if (file.fd < 0 || ::fstat(file.fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    snapshots_->unwatch(name);
    return fail(errc::region_not_found, "'" + name + "' is not a regular file");
  }
  CORMA_TRY(auto snapshot, snapshots_->read(file.fd, name, ticket));
  return snapshots_->lend(std::move(snapshot));
}

}  // namespace corma::cli
