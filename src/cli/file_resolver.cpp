#include "file_resolver.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace corma::cli {

namespace fs = std::filesystem;

Result<FileResolver> FileResolver::create(const fs::path& root) {
  std::error_code ec;
  auto canonical = fs::canonical(root, ec);
  if (ec || !fs::is_directory(canonical, ec)) {
    return fail(errc::not_configured, "serve root '" + root.string() + "' is not a directory");
  }
  return FileResolver(std::move(canonical));
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
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size == 0) {
    ::close(fd);
    return PublishedObject{{}, nullptr};
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) return fail(errc::backend, "cannot map '" + std::string(name) + "'");
  std::shared_ptr<const void> keepalive(mapping, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return PublishedObject{{static_cast<const std::byte*>(mapping), size}, std::move(keepalive)};
}

}  // namespace corma::cli
