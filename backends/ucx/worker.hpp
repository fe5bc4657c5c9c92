// A UCX worker as the progress thread drives it: created with its wake-up
// descriptor, progressed, armed before the thread sleeps, destroyed.
//
// The engine keeps two: one accepts peers (its address is what a target
// hands an initiator) and one connects to targets. UCX pairs an endpoint a
// worker creates towards a peer with an endpoint that peer's worker created
// towards it, matching them by a sequence number each side counts on its
// own; a worker that both accepted a peer's endpoints and connected to that
// peer could be handed one of the peer's old, closed endpoints instead of a
// new connection. A worker that only accepts, or only connects, never is.
#pragma once

#include <corma/error.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <ucp/api/ucp.h>

#include <cstddef>
#include <optional>

namespace corma::ucx {

class ProgressedWorker {
 public:
  ProgressedWorker() = default;
  ProgressedWorker(const ProgressedWorker&) = delete;
  ProgressedWorker& operator=(const ProgressedWorker&) = delete;

  /// Creates the worker and its wake-up descriptor (a dup of its event fd).
  Result<void> open(ucp_context_h context, boost::asio::io_context& io);
  [[nodiscard]] bool is_open() const noexcept { return handle_ != nullptr; }
  [[nodiscard]] ucp_worker_h handle() const noexcept { return handle_; }

  /// Progresses until the worker has nothing more to do; the events seen.
  std::size_t progress();
  /// Arms the event fd before the progress thread sleeps, and has the
  /// thread's io_context wake on it. False when events are pending.
  bool arm_for_sleep();
  /// Arms the event fd for a poll() of one's own: its descriptor, or -1
  /// when events are pending (or the worker is not open).
  int arm_for_poll();
  /// Closes the descriptor; the worker stays until destroy().
  void close_wake();
  void destroy();

 private:
  ucp_worker_h handle_ = nullptr;
  std::optional<boost::asio::posix::stream_descriptor> wake_;
  bool wake_armed_ = false;
};

}  // namespace corma::ucx
