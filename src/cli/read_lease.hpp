// A read lease on an open file (fcntl F_SETLEASE, F_RDLCK): the proof that
// nobody writes the file while it is held. The kernel grants it only while
// no process holds the file open for writing (a writable shared mapping
// counts, even after its descriptor was closed), and a process that then
// opens the file for writing, or truncates it, is held back until the lease
// is let go (at most /proc/sys/fs/lease-break-time). So bytes read while a
// lease is held, and found still held afterwards, are one version of the
// file.
#pragma once

#include <corma/error.hpp>

namespace corma::cli {

class ReadLease {
 public:
  /// Takes a read lease on `fd`, which must be open read-only.
  /// `object_changed` while someone holds the file open for writing (a
  /// writer at work: try again later); `not_configured` where no lease can
  /// be had at all (a file system without leases, or a file neither owned
  /// by this user nor covered by CAP_LEASE).
  static Result<ReadLease> take(int fd, std::string_view name);

  ReadLease(ReadLease&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ReadLease& operator=(ReadLease&&) = delete;
  ReadLease(const ReadLease&) = delete;
  ReadLease& operator=(const ReadLease&) = delete;
  /// Lets the lease go: a writer held back proceeds.
  ~ReadLease();

  /// Whether the lease is still whole: false once a writer asked for the
  /// file (its break is pending, or the kernel already took the lease away
  /// after lease-break-time). Bytes read before a break may be whole, but
  /// nothing proves it.
  [[nodiscard]] bool intact() const noexcept;

 private:
  explicit ReadLease(int fd) noexcept : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace corma::cli
