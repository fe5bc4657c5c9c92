// The UCX backend's engine: the state owned by the progress thread and the
// operations it runs. Only the progress thread touches UCX handles; callers
// reach it through submit().
#pragma once

#include <corma/detail/completion.hpp>
#include <corma/ucx.hpp>

#include <ucp/api/ucp.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace corma::ucx {

namespace asio = boost::asio;
using detail::Completion;

struct MapOp {
  Completion<void(Result<BackendRegion>)> completion;
  void* ptr = nullptr;
  std::size_t len = 0;
  Access access = Access::local;
  std::atomic<bool> cancelled{false};
  bool answered = false;
  std::uint64_t id = 0;
  std::optional<RegionId> mapped;
  BackendRegion result;
  std::unique_ptr<asio::steady_timer> timer;
};

struct VoidOp {
  Completion<void(Result<void>)> completion;
  std::atomic<bool> cancelled{false};
  bool answered = false;
};

struct TransferOp : VoidOp {
  bool is_put = false;
  TransferRequest request;
  std::uint64_t id = 0;
  ucp_rkey_h rkey = nullptr;
  bool owns_rkey = false;  // false: the peer's key cache owns it
  std::chrono::steady_clock::time_point deadline;
  ucs_status_t status = UCS_OK;
  std::vector<std::uint64_t>* finished = nullptr;  // the engine's completion list
};

template <class T>
struct ValueOp {
  Completion<void(Result<T>)> completion;
  std::vector<std::byte> blob;
  PeerId peer{};
};

struct Backend::Engine : std::enable_shared_from_this<Engine> {
  struct Region {
    ucp_mem_h memh = nullptr;
    std::byte* addr = nullptr;
    std::size_t len = 0;
    std::size_t transfers = 0;
    bool unmapping = false;
    std::vector<std::shared_ptr<VoidOp>> unmap_waiters;
  };
  /// A packed key that passed validation and was unpacked for one peer.
  struct CachedKey {
    ucp_rkey_h rkey = nullptr;
    std::uint64_t addr = 0;
    std::uint64_t len = 0;
  };
  struct Peer {
    ucp_ep_h ep = nullptr;
    bool broken = false;
    /// Keys are validated and unpacked once per peer, not per transfer.
    std::map<PackedKey, CachedKey> keys;
  };
  /// Beyond this many keys per peer, a key is unpacked for one transfer only.
  static constexpr std::size_t max_cached_keys = 4096;
  struct Closing {
    void* request = nullptr;
    std::shared_ptr<VoidOp> op;        // may be empty (closed by shutdown or abandoned)
    std::optional<PeerId> abandoned;   // a broken peer whose transfers are given up once closed
  };

  explicit Engine(const Config& config);

  /// Creates the UCX context and worker; runs on the progress thread.
  Result<void> start();
  /// The progress loop; returns once quit() has run.
  void loop();
  void run_until_quit(std::chrono::steady_clock::time_point last_activity);
  void quit();

  /// Runs `command` on the progress thread, or answers `refuse` (on the
  /// calling thread, with a posted completion) when the queue is full or the
  /// backend is shutting down.
  template <class Command, class Refuse>
  void submit(Command command, Refuse refuse);

  /// Installs a cancellation handler (on the caller's thread) that flags the
  /// op and posts `on_cancel` to the progress thread.
  template <class Op, class OnCancel>
  void watch_cancellation(const std::shared_ptr<Op>& op, OnCancel on_cancel);

  // Commands (progress thread).
  void run_map(const std::shared_ptr<MapOp>& op);
  void deliver_map(const std::shared_ptr<MapOp>& op);
  void cancel_map(const std::shared_ptr<MapOp>& op);
  void run_unmap(const std::shared_ptr<VoidOp>& op, RegionId id);
  void cancel_unmap(const std::shared_ptr<VoidOp>& op);
  void run_transfer(const std::shared_ptr<TransferOp>& op);
  void cancel_transfer(const std::shared_ptr<TransferOp>& op);
  void run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op);
  void run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op);
  void run_peer_complete(const std::shared_ptr<ValueOp<void>>& op);
  void run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id);
  void run_shutdown(const std::shared_ptr<VoidOp>& op);

  // Helpers (progress thread).
  [[nodiscard]] bool closed() const noexcept { return closing || torn_down; }
  Result<void> admit_transfer(TransferOp& op);
  void finish_transfer(std::uint64_t id, ucs_status_t status);
  void on_transfer_deadline(std::uint64_t id);
  /// One timer for every transfer deadline, armed while transfers are pending.
  void arm_deadline_sweep();
  void sweep_deadlines();
  void forget_keys(Peer& peer);
  Result<ucp_ep_h> create_endpoint(const std::vector<std::byte>& blob);
  void mark_broken(ucp_ep_h ep);
  /// Marks a peer broken and force-closes its endpoint.
  void abandon_endpoint(PeerId id, Peer& peer);
  /// The broken peer's endpoint is closed: whatever UCX did not finish on it
  /// never will; release the callers and the regions those transfers pinned.
  void orphan_transfers_of(PeerId peer);
  void release_region(RegionId id);
  /// Unmaps a region nobody transfers into and answers its waiters.
  void unmap_now(std::map<RegionId, Region>::iterator it);
  std::size_t progress();
  void poll_closing();
  void wait_for_events();
  void tear_down();

  static void on_transfer_done(void* request, ucs_status_t status, void* user_data);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  const Config config;
  const bool rma;

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::optional<asio::posix::stream_descriptor> wake;  // a dup of the worker's event fd
  bool wake_armed = false;

  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::uint64_t local_md_map = 0;
  std::vector<std::byte> own_address;

  std::atomic<std::int64_t> map_answer_delay_ns{0};
  std::atomic<std::size_t> maps_answered{0};
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> in_flight{0};
  std::atomic<std::size_t> queued{0};
  std::atomic<bool> accepting{true};

  bool closing = false;    // shutdown started: commands are answered shutting_down
  bool torn_down = false;  // UCX handles destroyed
  bool quitting = false;
  std::uint64_t next_id = 1;
  std::map<RegionId, Region> regions;
  std::map<PeerId, Peer> peers;
  std::map<std::uint64_t, std::shared_ptr<TransferOp>> transfers;
  std::map<std::uint64_t, std::shared_ptr<MapOp>> delayed_maps;
  std::vector<std::uint64_t> finished;  // filled by UCX callbacks, drained after progress
  std::optional<asio::steady_timer> deadline_sweep;
  bool sweep_armed = false;
  std::vector<Closing> closing_endpoints;
  /// Transfers given up with their broken peer. UCX may still hold their
  /// requests (and call back into them), so they live until the worker dies.
  std::vector<std::shared_ptr<TransferOp>> orphans;
};

template <class Command, class Refuse>
void Backend::Engine::submit(Command command, Refuse refuse) {
  if (!accepting.load(std::memory_order_acquire)) {
    return refuse(Error{errc::shutting_down, "UCX backend is shut down"});
  }
  if (queued.fetch_add(1, std::memory_order_acq_rel) >= config.command_queue_capacity) {
    queued.fetch_sub(1, std::memory_order_acq_rel);
    return refuse(Error{errc::backend, "UCX backend command queue full"});
  }
  asio::post(io, [self = shared_from_this(), command = std::move(command)]() mutable {
    self->queued.fetch_sub(1, std::memory_order_acq_rel);
    command(*self);
  });
}

template <class Op, class OnCancel>
void Backend::Engine::watch_cancellation(const std::shared_ptr<Op>& op, OnCancel on_cancel) {
  auto slot = op->completion.cancellation_slot();
  if (!slot.is_connected()) return;
  slot.assign([weak_engine = weak_from_this(), weak_op = std::weak_ptr<Op>(op),
               on_cancel](asio::cancellation_type) {
    auto target = weak_op.lock();
    if (!target) return;
    target->cancelled.store(true, std::memory_order_release);
    if (auto engine = weak_engine.lock()) {
      // Weak inside the queue too: a message posted after the loop ended must
      // not keep the engine (which owns the queue) alive.
      asio::post(engine->io, [weak_engine, target, on_cancel] {
        if (auto alive = weak_engine.lock()) on_cancel(*alive, target);
      });
    }
  });
}

}  // namespace corma::ucx
