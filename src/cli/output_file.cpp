#include "output_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace corma::cli {

Result<OutputFile> OutputFile::create(std::filesystem::path path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(errc::not_configured, "cannot create " + path.string() + ": " + std::strerror(errno));
  struct stat status {};
  const bool regular = ::fstat(fd, &status) == 0 && S_ISREG(status.st_mode);
  return OutputFile(std::move(path), fd, regular);
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), regular_(other.regular_), kept_(other.kept_) {}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!kept_ && regular_ && !path_.empty()) {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
}

ChunkSink OutputFile::sink() {
  return [fd = fd_, path = path_.string()](std::uint64_t offset, std::span<const std::byte> bytes) -> Result<void> {
    for (std::size_t at = 0; at < bytes.size();) {
      const auto wrote = ::pwrite(fd, bytes.data() + at, bytes.size() - at, static_cast<off_t>(offset + at));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) return fail(errc::backend, "writing " + path + ": " + std::strerror(errno));
      at += static_cast<std::size_t>(wrote);
    }
    return success();
  };
}

namespace {

Error file_error(const char* what, const std::filesystem::path& path) {
  return Error{errc::backend, std::string(what) + " " + path.string() + ": " + std::strerror(errno)};
}

/// The open file `fd` sized to `size` bytes and mapped shared.
Result<Landing> map_file(int fd, const std::filesystem::path& path, std::uint64_t size) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return file_error("sizing", path);
  if (size == 0) return Landing{};
  void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) return file_error("mapping", path);
  // Unmapped once the consumer lets go of it (after its registration is gone).
  std::shared_ptr<const void> mapping(mapped, [size](const void* at) { ::munmap(const_cast<void*>(at), size); });
  return Landing{std::span<std::byte>(static_cast<std::byte*>(mapped), size), std::move(mapping)};
}

}  // namespace

Result<Landing> OutputFile::map(std::uint64_t size) {
  if (!regular_) return fail(errc::not_configured, path_.string() + " is not a regular file: it cannot be mapped");
  return map_file(fd_, path_, size);
}

Result<void> OutputFile::truncate(std::uint64_t size) {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return file_error("sizing", path_);
  return success();
}

StreamDestination OutputFile::destination(const boost::asio::any_io_executor& writer) {
  StreamDestination destination;
  destination.async_sink = sink_on(writer, sink());
  if (!regular_) return destination;
  destination.rdma_landing = [fd = fd_, path = path_](std::uint64_t size) { return map_file(fd, path, size); };
  // Chunks go through the sink, not the mapping: a chunk read into the
  // mapping faults in and zeroes every page of the freshly sized file before
  // the bytes land, and made a 256 MiB chunked fetch about 40 % slower than a
  // read into a recycled buffer written with pwrite (bench `file_fetch
  // size=256MiB chunked`).
  destination.chunks_to_landing = false;
  return destination;
}

Result<void> OutputFile::keep() {
  kept_ = true;
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) return fail(errc::backend, "closing " + path_.string() + ": " + std::strerror(errno));
  return success();
}

}  // namespace corma::cli
