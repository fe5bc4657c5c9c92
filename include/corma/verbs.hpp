// The raw-verbs backend: libibverbs loaded at run time, one protection
// domain, an RC queue pair per peer, every verbs call on one progress thread.
// No verbs type appears here.
#pragma once

#include <corma/backend.hpp>
#include <corma/detail/engine_backend.hpp>
#include <corma/error.hpp>
#include <corma/progress.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

namespace corma::verbs {

/// This backend's descriptors and peer offers on the wire.
inline constexpr BackendId backend_id{2};

/// Path MTU of the queue pairs; `port` takes the port's active MTU.
enum class Mtu : std::uint16_t { port = 0, mtu256 = 256, mtu512 = 512, mtu1024 = 1024, mtu2048 = 2048, mtu4096 = 4096 };

struct Config {
  /// Device to open (e.g. "mlx5_0"); empty: the first device.
  std::string device;
  std::uint8_t port = 1;
  /// GID table index for the address vector. Unset: on RoCE, the first
  /// RoCE v2 GID; on InfiniBand, no GID (LID routing).
  std::optional<int> gid_index;
  /// Work requests a queue pair may have outstanding; more wait in a local
  /// backlog and are posted as completions free room (never an overrun).
  std::uint32_t send_queue_depth = 128;
  /// The completion queue shared by every queue pair. Outstanding work
  /// across all peers is kept below it.
  std::uint32_t completion_queue_depth = 4096;
  /// Local ACK timeout exponent (4.096 µs × 2^timeout), retry counts.
  std::uint8_t timeout = 14;
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry = 7;
  /// RDMA reads in flight per queue pair; 0 takes the device's limit.
  std::uint8_t max_rd_atomic = 0;
  Mtu mtu = Mtu::port;
  /// Registers with IBV_ACCESS_RELAXED_ORDERING (through ibv_reg_mr_iova2)
  /// when the library has it.
  bool relaxed_ordering = false;

  ProgressMode progress = ProgressMode::adaptive;
  /// adaptive: how long to keep polling after the last activity.
  std::chrono::microseconds spin_time{100};
  /// Commands waiting for the progress thread; past it, refused with `backend`.
  std::size_t command_queue_capacity = 65536;
  /// Every transfer is answered `timeout` past this deadline; its queue pair
  /// is then moved to the error state and the peer treated as broken.
  std::chrono::milliseconds operation_timeout{30000};
  /// Shutdown waits this long for transfers in flight, then flushes.
  std::chrono::milliseconds shutdown_timeout{5000};
};

/// A failed work completion answers `backend` (or `peer_unreachable` when the
/// peer stopped responding: retries exhausted) with Error::cause in this
/// category: the value is the ibv_wc_status, the message the provider's
/// ibv_wc_status_str.
[[nodiscard]] const std::error_category& completion_category() noexcept;

class Backend final : public detail::EngineBackend {
 public:
  /// Loads libibverbs.so.1 and opens the configured device. `not_configured`
  /// says which of these is missing: the library, kernel support (ENOSYS),
  /// a device, an active port.
  [[nodiscard]] static Result<std::shared_ptr<Backend>> create(const Config& config);

  [[nodiscard]] std::string_view key() const noexcept override { return "verbs"; }
  [[nodiscard]] BackendId wire_id() const noexcept override { return backend_id; }

  /// The device that was opened.
  [[nodiscard]] const std::string& device_name() const noexcept;
  /// The largest single work request (the port's max_msg_sz); larger
  /// transfers are split into several.
  [[nodiscard]] std::uint32_t max_message_size() const noexcept;
  [[nodiscard]] const Config& config() const noexcept;

  struct Engine;

 private:
  Backend(std::shared_ptr<Engine> engine, std::thread progress_thread);

  std::shared_ptr<const Engine> engine_;
};

}  // namespace corma::verbs
