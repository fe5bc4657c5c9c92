#include "announced_files.hpp"

#include <corma/rendezvous.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sys/stat.h>

#include <optional>

namespace corma::cli {

namespace asio = boost::asio;
namespace fs = std::filesystem;

Result<FileVersions> scan_files(const fs::path& root, std::size_t most) {
  FileVersions files;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec);
  if (ec) return fail(errc::not_configured, "cannot read " + root.string() + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return fail(errc::not_configured, "cannot read under " + root.string() + ": " + ec.message());
    // lstat: a link is not followed out of the root, and a file's time is
    // the file's own.
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    auto name = it->path().lexically_relative(root).generic_string();
    if (!check_object_name(name)) continue;
    if (files.size() == most) {
      return fail(errc::out_of_range, "more than " + std::to_string(most) +
                                          " files under the root: announce prefixes (--announce) instead");
    }
    const auto version = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000u +
                         static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
    files.emplace(std::move(name), version);
  }
  return files;
}

struct FileAnnouncer::State {
  State(asio::any_io_executor ex, asio::any_io_executor s, Directory& d, Announcement b, fs::path r,
        std::chrono::milliseconds e)
      : executor(ex), scanner(s), directory(d), base(std::move(b)), root(std::move(r)), every(e), rescan(ex) {}

  asio::any_io_executor executor;
  asio::any_io_executor scanner;
  Directory& directory;
  Announcement base;
  fs::path root;
  std::chrono::milliseconds every;
  asio::steady_timer rescan;
  bool stopped = false;

  static asio::awaitable<void> keep_announced(std::shared_ptr<State> self, Told told) {
    std::optional<FileVersions> announced;
    for (;;) {
      // Scanned on a file thread (a large tree takes a while), answered here.
      // Named, not a temporary in the co_await: g++ 12 destroys those twice.
      std::optional<Result<FileVersions>> scan;
      auto scan_tree = [&scan, root = self->root]() -> asio::awaitable<void> {
        scan.emplace(scan_files(root, max_announced_files));
        co_return;
      };
      co_await asio::co_spawn(self->scanner, std::move(scan_tree), asio::use_awaitable);
      if (self->stopped) co_return;
      auto& scanned = *scan;
      if (!scanned) {
        told(std::move(scanned).error(), 0);
      } else if (!announced || scanned.value() != *announced) {
        auto a = self->base;
        for (const auto& [name, version] : scanned.value()) a.names.push_back(name);
        a.versions.insert(scanned.value().begin(), scanned.value().end());
        auto done = co_await self->directory.async_announce(std::move(a), asio::use_awaitable);
        if (self->stopped) co_return;
        // Announced again at the next scan when it failed.
        if (done) announced = scanned.value();
        told(done, scanned.value().size());
      }
      self->rescan.expires_after(self->every);
      auto [ec] = co_await self->rescan.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec || self->stopped) co_return;
    }
  }
};

FileAnnouncer::FileAnnouncer(asio::any_io_executor executor, asio::any_io_executor scanner, Directory& directory,
                             Announcement base, fs::path root, std::chrono::milliseconds every)
    : state_(std::make_shared<State>(std::move(executor), std::move(scanner), directory, std::move(base),
                                     std::move(root), every)) {}

void FileAnnouncer::start(Told told) {
  asio::co_spawn(state_->executor, State::keep_announced(state_, std::move(told)), asio::detached);
}

void FileAnnouncer::stop() {
  state_->stopped = true;
  state_->rescan.cancel();
}

}  // namespace corma::cli
