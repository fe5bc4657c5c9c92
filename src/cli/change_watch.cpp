#include "change_watch.hpp"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace corma::cli {
namespace {

/// What may change a file's bytes, or tell that they may change (an open:
/// possibly for writing).
constexpr std::uint32_t file_events =
    IN_OPEN | IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF;
/// What may change which file a name in a directory leads to.
constexpr std::uint32_t directory_events =
    IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_MOVE_SELF | IN_DELETE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW;
/// Events about the watched object itself rather than one of its entries.
constexpr std::uint32_t self_events = IN_MOVE_SELF | IN_DELETE_SELF | IN_IGNORED | IN_UNMOUNT;

}  // namespace

Result<ChangeWatch> ChangeWatch::create() {
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) return fail(errc::not_configured, std::string("no inotify instance: ") + std::strerror(errno));
  return ChangeWatch(fd);
}

ChangeWatch::ChangeWatch(ChangeWatch&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      watched_(std::move(other.watched_)),
      subscriptions_(std::move(other.subscriptions_)) {}

ChangeWatch::~ChangeWatch() {
  if (fd_ >= 0) ::close(fd_);
}

int ChangeWatch::add(const char* path, std::uint32_t mask) { return ::inotify_add_watch(fd_, path, mask); }

bool ChangeWatch::watch_name(const std::string& key, const std::filesystem::path& root, std::string_view relative) {
  forget(key);
  Subscription subscription;
  std::filesystem::path directory = root;
  const std::filesystem::path name(relative);
  for (auto part = name.begin(); part != name.end(); ++part) {
    const int wd = add(directory.c_str(), directory_events);
    if (wd < 0) {
      subscriptions_[key] = std::move(subscription);
      forget(key);
      return false;
    }
    watched_[wd].children[part->string()].insert(key);
    subscription.directories.emplace_back(wd, part->string());
    directory /= *part;
  }
  subscriptions_[key] = std::move(subscription);
  return true;
}

bool ChangeWatch::watch_file(const std::string& key, int fd) {
  auto subscription = subscriptions_.find(key);
  if (subscription == subscriptions_.end()) return false;
  // Through the descriptor: the watch is on the very file that was opened,
  // whatever its name leads to by now.
  const std::string by_descriptor = "/proc/self/fd/" + std::to_string(fd);
  const int wd = add(by_descriptor.c_str(), file_events);
  if (wd < 0) {
    forget(key);
    return false;
  }
  watched_[wd].keys.insert(key);
  subscription->second.file = wd;
  return true;
}

void ChangeWatch::forget(const std::string& key) {
  auto subscription = subscriptions_.find(key);
  if (subscription == subscriptions_.end()) return;
  const auto& [file, directories] = subscription->second;
  if (auto it = watched_.find(file); it != watched_.end()) {
    it->second.keys.erase(key);
    release_if_unused(file);
  }
  for (const auto& [wd, entry] : directories) {
    auto it = watched_.find(wd);
    if (it == watched_.end()) continue;
    if (auto child = it->second.children.find(entry); child != it->second.children.end()) {
      child->second.erase(key);
      if (child->second.empty()) it->second.children.erase(child);
    }
    release_if_unused(wd);
  }
  subscriptions_.erase(subscription);
}

void ChangeWatch::release_if_unused(int wd) {
  auto it = watched_.find(wd);
  if (it == watched_.end() || !it->second.unused()) return;
  watched_.erase(it);
  (void)::inotify_rm_watch(fd_, wd);  // its IN_IGNORED event finds no entry
}

void ChangeWatch::all_keys(std::unordered_set<std::string>& into) const {
  for (const auto& [key, subscription] : subscriptions_) into.insert(key);
}

std::vector<std::string> ChangeWatch::changed() {
  std::unordered_set<std::string> keys;
  alignas(inotify_event) char buffer[16384];
  for (;;) {
    const auto got = ::read(fd_, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EAGAIN: nothing more
    for (std::size_t at = 0; at < static_cast<std::size_t>(got);) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      at += sizeof(inotify_event) + event->len;
      if ((event->mask & IN_Q_OVERFLOW) != 0) {
        all_keys(keys);  // events were lost: nothing is proven any more
        continue;
      }
      auto it = watched_.find(event->wd);
      if (it == watched_.end()) continue;
      auto& watched = it->second;
      keys.insert(watched.keys.begin(), watched.keys.end());
      if ((event->mask & self_events) != 0 || event->len == 0) {
        for (const auto& [entry, under] : watched.children) keys.insert(under.begin(), under.end());
      } else if (auto child = watched.children.find(event->name); child != watched.children.end()) {
        keys.insert(child->second.begin(), child->second.end());
      }
    }
  }
  return {keys.begin(), keys.end()};
}

}  // namespace corma::cli
