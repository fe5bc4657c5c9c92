// Which served files may have changed since they were read, seen through
// inotify: a snapshot is handed out again only while nothing that could
// change its file, or the name that leads to it, has happened since.
//
// For a file, any open counts (IN_OPEN): a write needs a descriptor open
// for writing, and the snapshot was read under a read lease (read_lease.hpp)
// that no such descriptor existed, so every later write starts with an
// open seen here, writes through a shared mapping included (they raise no
// event of their own). Writes, truncation, attribute and link-count changes,
// renames and deletion count too. For each directory on the way from the
// root, entries created, deleted or renamed under the name's next component
// count (a file renamed over the name), as do the directory's own rename
// and deletion.
#pragma once

#include <corma/error.hpp>

#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace corma::cli {

class ChangeWatch {
 public:
  /// An inotify instance; `not_configured` when the system gives none.
  static Result<ChangeWatch> create();

  ChangeWatch(ChangeWatch&& other) noexcept;
  ChangeWatch& operator=(ChangeWatch&&) = delete;
  ChangeWatch(const ChangeWatch&) = delete;
  ChangeWatch& operator=(const ChangeWatch&) = delete;
  ~ChangeWatch();

  /// Watches, for `key`, the directories from `root` down to `relative`'s
  /// parent. Call before the file is opened: whatever happens to the name
  /// after this is seen. False when a watch cannot be placed (the key is
  /// then not watched at all).
  bool watch_name(const std::string& key, const std::filesystem::path& root, std::string_view relative);
  /// Watches, for `key`, the file open at `fd` (call after watch_name).
  bool watch_file(const std::string& key, int fd);
  /// Stops watching for `key`; watches nobody needs any more are removed.
  void forget(const std::string& key);

  /// Reads what happened since the last call: the keys whose file or name
  /// may have changed (each once), or every key when events were lost.
  std::vector<std::string> changed();

 private:
  struct Watched {
    std::unordered_set<std::string> keys;  ///< keys watching this file itself
    /// For a directory: keys whose path goes through each entry name.
    std::unordered_map<std::string, std::unordered_set<std::string>> children;
    [[nodiscard]] bool unused() const noexcept { return keys.empty() && children.empty(); }
  };
  struct Subscription {
    int file = -1;
    std::vector<std::pair<int, std::string>> directories;  ///< (watch, entry name)
  };

  explicit ChangeWatch(int fd) noexcept : fd_(fd) {}
  int add(const char* path, std::uint32_t mask);
  void release_if_unused(int wd);
  void all_keys(std::unordered_set<std::string>& into) const;

  int fd_ = -1;
  std::unordered_map<int, Watched> watched_;
  std::unordered_map<std::string, Subscription> subscriptions_;
};

}  // namespace corma::cli
