// The UCX (ucp) backend: every ucp call on one progress thread that owns the
// context and a single-threaded worker. No UCX type appears here.
#pragma once

#include <corma/backend.hpp>
#include <corma/detail/engine_backend.hpp>
#include <corma/error.hpp>
#include <corma/progress.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

namespace corma::ucx {

/// This backend's descriptors and peer offers on the wire.
inline constexpr BackendId backend_id{1};

/// How the progress thread waits for work (see corma/progress.hpp).
using ProgressMode = corma::ProgressMode;

/// Which UCX transports the worker may use.
enum class Transport {
  /// UCX `tcp` with `trusted_peers`: works across hosts; RMA is emulated in
  /// software. Without `trusted_peers` the worker opens no tcp interface at
  /// all (UCX `self` only): local registrations, no peers.
  tcp,
  shared_memory,  ///< UCX `sm` (posix / sysv / cma): same host only; opens no socket
};

/// How endpoints react to a dead peer.
enum class ErrorHandling {
  /// UCP_ERR_HANDLING_MODE_PEER: a dead peer fails its operations at once.
  /// UCX drops shared-memory lanes in this mode, so it needs `tcp`.
  peer,
  /// UCP_ERR_HANDLING_MODE_NONE: UCX does not notice a dead peer; the
  /// per-operation deadline answers `timeout` and marks the peer broken.
  none,
};

struct Config {
  Transport transport = Transport::tcp;
  ErrorHandling error_handling = ErrorHandling::peer;
  ProgressMode progress = ProgressMode::adaptive;
  /// adaptive: how long to keep spinning after the last activity.
  std::chrono::microseconds spin_time{100};
  /// Commands waiting for the progress thread; past it, new commands are
  /// refused with `backend` ("command queue full") instead of queueing
  /// without bound.
  std::size_t command_queue_capacity = 65536;
  /// Every transfer is answered `timeout` past this deadline, and its peer is
  /// then treated as broken.
  std::chrono::milliseconds operation_timeout{30000};
  /// Shutdown waits this long for transfers in flight, then force-closes.
  std::chrono::milliseconds shutdown_timeout{5000};
  /// SECURITY. UCX over `tcp` emulates RMA in software and checks nothing: any
  /// peer that can reach this worker can read (and, with put, write) ANY
  /// address of this process with any key, registered or not. With
  /// `trusted_peers = false` (the default) a `tcp` backend does not enable
  /// RMA and opens no tcp interface at all: maps with remote access,
  /// transfers and peer offers and accepts answer `not_configured`, and the
  /// rendezvous layer falls back to its bounds-checked chunked path. Set it
  /// only when every peer that can reach the worker is trusted with all of
  /// this process's memory, and name `tcp_interface`. Shared memory is
  /// reachable only from this host and bounded by the OS to processes of the
  /// same user (who could read this memory anyway), so it does not need this
  /// setting.
  bool trusted_peers = false;
  /// Trusted tcp only: the one network device (as `ip link` names it, e.g.
  /// "lo" or "eth0") on which UCX opens its tcp interface and listening
  /// socket. Empty: UCX's default, every interface that is up. Ignored where
  /// no tcp interface is opened (untrusted tcp, shared memory).
  std::string tcp_interface{};
};

class Backend final : public detail::EngineBackend {
 public:
  /// Starts the progress thread and creates the UCX context and worker.
  /// Answers `not_configured` when the configuration cannot work (shared
  /// memory with peer error handling, a tcp_interface that is not one device
  /// name) or UCX refuses to start (no such device).
  [[nodiscard]] static Result<std::shared_ptr<Backend>> create(const Config& config);

  [[nodiscard]] std::string_view key() const noexcept override { return "ucx"; }
  [[nodiscard]] BackendId wire_id() const noexcept override { return backend_id; }

  /// Whether this backend exposes memory for RMA (see Config::trusted_peers).
  [[nodiscard]] bool rma_enabled() const noexcept;
  [[nodiscard]] const Config& config() const noexcept;

  struct Engine;

 private:
  Backend(std::shared_ptr<Engine> engine, std::thread progress_thread);

  std::shared_ptr<const Engine> engine_;
};

}  // namespace corma::ucx
