#include "read_lease.hpp"

#include <fcntl.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace corma::cli {

Result<ReadLease> ReadLease::take(int fd, std::string_view name) {
  // A lease break is announced to the lease holder by a signal (SIGIO,
  // whose default action ends the process). This holder needs no
  // announcement: it checks intact() after reading. So the signal is set
  // to one that is ignored by default before the lease is taken, and the
  // descriptor's owner cleared right after (the kernel sends nothing to an
  // owner of 0), which leaves a window of two system calls in which a
  // writer would raise a SIGURG that nobody sees.
  if (::fcntl(fd, F_SETSIG, SIGURG) != 0 || ::fcntl(fd, F_SETLEASE, F_RDLCK) != 0) {
    const int error = errno;
    if (error == EAGAIN || error == EBUSY) {
      return fail(errc::object_changed, "'" + std::string(name) + "' is open for writing");
    }
    return fail(errc::not_configured, "cannot take a read lease on '" + std::string(name) +
                                          "' (needed to prove that a version is read whole): " +
                                          std::strerror(error));
  }
  ReadLease lease(fd);
  (void)::fcntl(fd, F_SETOWN, 0);
  return lease;
}

ReadLease::~ReadLease() {
  if (fd_ >= 0) (void)::fcntl(fd_, F_SETLEASE, F_UNLCK);
}

bool ReadLease::intact() const noexcept { return ::fcntl(fd_, F_GETLEASE) == F_RDLCK; }

}  // namespace corma::cli
