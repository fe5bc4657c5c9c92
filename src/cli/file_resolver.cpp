#include "file_resolver.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace corma::cli {

namespace fs = std::filesystem;

Result<FileResolver> FileResolver::create(const fs::path& root, std::uint64_t snapshot_limit) {
  std::error_code ec;
  auto canonical = fs::canonical(root, ec);
  if (ec || !fs::is_directory(canonical, ec)) {
    return fail(errc::not_configured, "serve root '" + root.string() + "' is not a directory");
  }
  return FileResolver(std::move(canonical), snapshot_limit);
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

}  // namespace

Result<PublishedObject> FileResolver::operator()(std::string_view name) const {
  const fs::path relative(name);
  if (name.empty() || relative.is_absolute() || relative.has_root_name()) {
    return fail(errc::not_owned, "only relative paths are served");
  }
  for (const auto& part : relative) {
    if (part == "..") return fail(errc::not_owned, "'..' is not served");
  }
  std::error_code ec;
  // Resolves every symlink: whatever the name says, the real file must be
  // under the root.
  const auto real = fs::canonical(root_ / relative, ec);
  if (ec) return fail(errc::region_not_found, "no file '" + std::string(name) + "'");
  if (!is_inside(root_, real)) return fail(errc::not_owned, "'" + std::string(name) + "' leads outside the root");

  // O_NOFOLLOW on the resolved path: a symlink swapped in after the check is refused.
  const int fd = ::open(real.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return fail(errc::region_not_found, "cannot open '" + std::string(name) + "'");
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return fail(errc::region_not_found, "'" + std::string(name) + "' is not a regular file");
  }
  if (info.st_size == 0) {
    ::close(fd);
    return PublishedObject{{}, nullptr};
  }
  auto snapshot = snapshots_->snapshot(fd, real.string(), name);
  ::close(fd);
  if (!snapshot) return std::move(snapshot).error();
  const auto bytes = snapshot.value()->bytes();
  return PublishedObject{bytes, std::move(snapshot).value()};
}

}  // namespace corma::cli
