// What every provider-backed engine (UCX, verbs) shares: the progress
// thread's loop, the bounded command queue, cancellation hooks, the region
// table with its unmap-waits-for-transfers rule, delayed map answers and the
// deadline sweep's timer. Transfers, typed by the provider's own op, are
// TransferEngine's (transfer_engine.hpp); a provider derives from that and
// supplies the hooks (map/unmap one region, run a transfer, progress, arm
// for sleep, peers, shutdown). Everything but submit(), the initiating
// functions and the cancellation hook runs on the progress thread.
#pragma once

#include "backend_kit/command_queue.hpp"
#include "backend_kit/ops.hpp"
#include "backend_kit/progress_executor.hpp"

#include <corma/detail/notification_inbox.hpp>
#include <corma/progress.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <boost/asio/thread_pool.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace corma::backend_kit {

struct EngineSettings {
  std::string name;  ///< the provider, in messages: "UCX", "verbs"
  ProgressMode progress = ProgressMode::adaptive;
  std::chrono::microseconds spin_time{100};
  std::size_t command_queue_capacity = 65536;
  std::chrono::milliseconds operation_timeout{30000};
  std::chrono::milliseconds shutdown_timeout{5000};
  /// Maps of at least this many bytes may be registered with the provider
  /// on the engine's registration thread rather than on the progress
  /// thread: pinning a large region (ibv_reg_mr) takes time in proportion
  /// to its pages, and the progress thread must meanwhile keep completing
  /// every other peer's transfers.
  std::size_t off_thread_map_bytes = std::size_t{1} << 20;
  /// Such a map is registered on the progress thread after all when the
  /// provider's last registration of a region of the same size class (a
  /// power of two) took less than this: the hand-over to the registration
  /// thread and back costs two thread wake-ups, tens of microseconds, which
  /// a provider that pins nothing (UCX over tcp or shared memory) would pay
  /// for a map of a few microseconds.
  std::chrono::microseconds inline_map_limit{50};
};

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  /// What a provider registered for one map.
  struct Registration {
    void* handle = nullptr;  ///< the provider's own (ucp_mem_h, ibv_mr*...)
    std::uint64_t effective_addr = 0;
    std::uint64_t effective_len = 0;
    PackedKey packed_key;
  };
  struct Region {
    void* handle = nullptr;
    std::byte* addr = nullptr;
    std::size_t len = 0;
    std::size_t transfers = 0;  ///< admitted and not finished: they pin the region
    bool unmapping = false;     ///< the last transfer out unmaps
    std::vector<std::shared_ptr<VoidOp>> unmap_waiters;
  };
  using RegionTable = std::map<RegionId, Region>;

  explicit EngineCore(EngineSettings settings);
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;
  virtual ~EngineCore();

  // ---- any thread ----

  /// Runs `command()` on the progress thread, or answers `refuse` (on the
  /// calling thread) when the queue is full or the backend is shutting down.
  /// The command may hold a plain reference to the engine: the engine owns
  /// the queue and drains it before it goes.
  template <class Command, class Refuse>
  void submit(Command command, Refuse refuse);

  /// Installs a cancellation handler (on the caller's thread) that, for the
  /// `honoured` types, flags the op and posts `on_cancel(op)` to the
  /// progress thread, which runs it only while the engine is alive.
  template <class Op, class OnCancel>
  void watch_cancellation(const std::shared_ptr<Op>& op, asio::cancellation_type honoured, OnCancel on_cancel) {
    watch_cancellation(op, caller_completion(*op), honoured, std::move(on_cancel));
  }
  /// The same, for an op whose caller's slot is on `completion`.
  template <class Op, class CallerCompletion, class OnCancel>
  void watch_cancellation(const std::shared_ptr<Op>& op, const CallerCompletion& completion,
                          asio::cancellation_type honoured, OnCancel on_cancel);

  /// A get or put; a batch of them (TransferEngine implements both over the
  /// provider's own transfer op).
  virtual void initiate_transfer(bool is_put, TransferRequest request, RdmaBackend::Handler<void> h) = 0;
  virtual void initiate_batch(bool is_put, TransferBatch batch, std::optional<BatchNotification> notification,
                              RdmaBackend::Handler<BatchOutcome> h) = 0;
  virtual void initiate_atomic(AtomicRequest request, RdmaBackend::Handler<std::uint64_t> h) = 0;
  virtual void initiate_flush(PeerId peer, RdmaBackend::Handler<void> h) = 0;
  virtual void initiate_notify(PeerId peer, std::uint64_t tag, RdmaBackend::Handler<void> h) = 0;

  /// RdmaBackend::progress_executor(): runs work on the progress thread
  /// (progress_executor.hpp).
  [[nodiscard]] ProgressExecutor progress_executor() const noexcept { return ProgressExecutor(commands_); }

  /// Refuses new commands from now on.
  void stop_accepting() noexcept { accepting_.store(false, std::memory_order_release); }
  /// Refuses new commands from now on, and runs `last()` on the progress
  /// thread after every command queued before (a shutdown: what was asked
  /// before it runs first, in order, however the progress thread sleeps).
  /// `last` holds the engine: it runs even though nothing more is accepted.
  template <class Last>
  void submit_last(Last last) {
    stop_accepting();
    commands_->push(std::move(last));
  }
  [[nodiscard]] std::size_t live_registrations() const noexcept { return live_.load(std::memory_order_acquire); }
  [[nodiscard]] std::size_t transfers_in_flight() const noexcept { return in_flight_.load(std::memory_order_acquire); }
  [[nodiscard]] std::uint64_t refused_notifications() const noexcept {
    return refused_notifications_.load(std::memory_order_relaxed);
  }

  // ---- provider hooks (progress thread) ----

  virtual Result<Registration> provider_map(void* ptr, std::size_t len, Access access) = 0;
  virtual Result<void> provider_unmap(void* handle) = 0;
  /// Checks and unpacks `op->blob` for `op->peer` (see check_import).
  virtual void run_import_key(const std::shared_ptr<ValueOp<RemoteKeyId>>& op) = 0;
  /// Idempotent; transfers already admitted keep what they use.
  virtual void run_release_key(const std::shared_ptr<VoidOp>& op, RemoteKeyId key) = 0;
  virtual void run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op) = 0;
  virtual void run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op) = 0;
  virtual void run_peer_complete(const std::shared_ptr<ValueOp<void>>& op) = 0;
  virtual void run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id) = 0;
  /// Shutdown, once transfers had their chance: flush or close every peer
  /// (bounded by the shutdown timeout), failing what is still in flight.
  virtual void close_peers() = 0;
  /// Destroys every provider handle; regions are already unmapped.
  virtual void tear_down() = 0;
  /// Drives the provider; the number of events handled (0: idle).
  virtual std::size_t progress() = 0;
  /// Prepares to sleep until the provider has events (arms its fd watch).
  /// False when events are already pending: progress again instead.
  virtual bool arm_for_sleep() = 0;

  // ---- progress thread ----

  void loop();
  void quit();
  [[nodiscard]] bool closed() const noexcept { return closing_ || torn_down_; }
  [[nodiscard]] bool closing() const noexcept { return closing_; }
  [[nodiscard]] bool torn_down() const noexcept { return torn_down_; }
  [[nodiscard]] Error shut_down_error() const;
  [[nodiscard]] Error provider_error(errc code, const std::string& what) const;
  /// A fresh id for a region, peer or imported key.
  std::uint64_t new_id() noexcept { return next_id_++; }

  /// The shutdown order every provider backend follows (docs/backends.md):
  /// refuse, undo unanswered maps, wait for transfers, close peers, tear the
  /// provider down, through the provider's hooks; `op` may be empty (the
  /// destructor's shutdown).
  void run_shutdown(const std::shared_ptr<VoidOp>& op);
  /// Drives progress() until `done` holds or the shutdown timeout passes.
  template <class Done>
  void progress_until(Done done);

  void run_map(const std::shared_ptr<MapOp>& op);
  void cancel_map(const std::shared_ptr<MapOp>& op);
  void run_unmap(const std::shared_ptr<VoidOp>& op, RegionId id);
  void cancel_unmap(const std::shared_ptr<VoidOp>& op);

  using Receiver = detail::NotificationInbox::Receiver;
  void run_receive(const std::shared_ptr<Receiver>& receiver) { inbox_.receive(receiver, progress_executor()); }
  void cancel_receive(const std::shared_ptr<Receiver>& receiver) { inbox_.cancel(receiver); }
  /// A notification from an accepted peer arrived: queued for a receiver,
  /// or refused (`budget_exceeded`: the sender is told).
  Result<void> deliver_notification(Notification notification) {
    if (closed()) return shut_down_error();
    return inbox_.deliver(notification);
  }
  /// One arrived from a peer this side never accepted: dropped, counted.
  void note_refused_notification() noexcept { refused_notifications_.fetch_add(1, std::memory_order_relaxed); }

  /// What every import checks before the provider sees the key: open, the
  /// key's size, and room in the peer's table (`imported` keys already).
  Result<void> check_import(const PackedKey& key, std::size_t imported) const;

  /// The local half of admitting a transfer: open, non-empty, its region
  /// registered and not unmapping, its slice inside. Does not pin.
  Result<Region*> admit_local(const TransferRequest& request);
  /// The region the last element of a batch named, for the next one.
  struct LastRegion {
    RegionId id{};
    Region* region = nullptr;
  };
  /// admit_local for the elements of a batch, one after another: an element
  /// naming the same region as the one before it costs no look-up.
  Result<Region*> admit_local(const TransferRequest& request, LastRegion& last);
  /// A transfer admitted on region `id` holds it: an unmap waits for it.
  void pin(RegionId id);
  /// The transfer that pinned `id` is over: an unmap waiting for it runs.
  void unpin(RegionId id);
  /// Stops the deadline sweep (the provider is being torn down).
  void stop_deadline_sweep();

  const EngineSettings settings;
  /// Run by the progress thread alone, between provider progress rounds:
  /// timers, the provider's fd watches, shutdown. The loop is no handler of
  /// it (see loop()).
  asio::io_context io{1};

  // Testing aids, reached through backend_kit::core_of: a delay between
  // registering a region and answering its map (opens the "mapped, not
  // answered" window), and how many map results were handed over.
  std::atomic<std::int64_t> map_answer_delay_ns{0};
  std::atomic<std::size_t> maps_answered{0};
  /// Run with the length of every map just before the provider registers
  /// it, on whichever thread registers it: a hook that waits stands for a
  /// provider slow to register. Set and reset only while no map is under way.
  std::function<void(std::size_t)> provider_map_hook;

 protected:
  // ---- the transfer table's side (TransferEngine), progress thread ----

  /// Whether every admitted transfer has finished.
  [[nodiscard]] virtual bool transfers_idle() const = 0;
  /// Shutdown: answers every transfer the provider never finished.
  virtual void fail_unfinished_transfers() = 0;
  /// Shutdown, after tear_down(): provider requests that referenced
  /// transfer ops died with the provider; the ops go too.
  virtual void drop_transfers() = 0;
  /// Answers the transfers whose deadline is past `now`; whether any remain.
  virtual bool answer_late_transfers(std::chrono::steady_clock::time_point now) = 0;

  /// A transfer was admitted on `region` (none for an atomic or a flush)
  /// and handed to the provider: it pins the region and is swept for its
  /// deadline.
  void note_transfer_started(Region* region);
  /// An admitted transfer left the table (it may still pin its region).
  void note_transfer_left() noexcept { in_flight_.fetch_sub(1, std::memory_order_acq_rel); }
  /// Shutdown answered every transfer.
  void note_no_transfers() noexcept { in_flight_.store(0, std::memory_order_release); }
  /// A deadline for a transfer admitted this turn. The turn's clock, not a
  /// clock read per transfer: a deadline a turn early is harmless, a
  /// clock_gettime per small get is not.
  [[nodiscard]] std::chrono::steady_clock::time_point deadline_from_now() const noexcept {
    return turn_time_ + settings.operation_timeout;
  }
  /// The provider's handles are gone (set by tear_down()).
  void mark_torn_down() noexcept { torn_down_ = true; }

 private:
  void run_until_quit();
  void undo_delayed_maps();
  void unmap_all();
  /// The provider's registration for `op`, made on the calling thread.
  Result<Registration> register_in_provider(const MapOp& op);
  /// Whether `len` bytes are registered on the registration thread: large,
  /// and of a size class not seen yet or seen to take the provider long.
  [[nodiscard]] bool maps_off_thread(std::size_t len) const noexcept;
  /// Records how long the provider took to register `len` bytes.
  void note_map_time(std::size_t len, std::chrono::nanoseconds took) noexcept;
  /// Hands `op` to the registration thread (started on first use).
  void map_off_thread(const std::shared_ptr<MapOp>& op);
  /// Answers the maps the registration thread has finished.
  void take_maps_registered_off_thread();
  /// Shutdown: waits for the registration thread's maps and undoes them.
  void stop_registration_thread();
  /// Records a region the provider registered for `op` (or answers its
  /// failure) and answers the map.
  void finish_map(const std::shared_ptr<MapOp>& op, Result<Registration> registered);
  void deliver_map(const std::shared_ptr<MapOp>& op);
  void release_region(RegionId id);
  void unmap_now(RegionTable::iterator it);
  void arm_deadline_sweep();

  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io);
  /// The registration thread (see EngineSettings::off_thread_map_bytes).
  /// Its maps hand their results over through `registered_off_thread_`,
  /// which the progress thread takes when the registrar posts it a turn.
  struct RegisteredOffThread {
    std::shared_ptr<MapOp> op;
    Result<Registration> registered;
    std::chrono::nanoseconds took{0};
  };
  /// The provider's last registration time, in nanoseconds, for maps of
  /// off_thread_map_bytes or more, by size class (the bit width of the
  /// length); 0 where none was seen. Progress thread.
  std::array<std::uint64_t, 65> map_ns_by_size_class_{};
  std::optional<asio::thread_pool> registrar_;
  std::atomic<bool> registrar_stopping_{false};
  std::mutex registered_off_thread_mutex_;
  std::vector<RegisteredOffThread> registered_off_thread_;
  /// Shared with the progress executors handed out, which may outlive the engine.
  std::shared_ptr<CommandQueue> commands_ = std::make_shared<CommandQueue>(io);
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> in_flight_{0};
  std::atomic<std::uint64_t> refused_notifications_{0};
  detail::NotificationInbox inbox_;
  std::atomic<std::size_t> queued_{0};
  std::atomic<bool> accepting_{true};
  bool quitting_ = false;
  bool closing_ = false;    // shutdown started: commands are answered shutting_down
  bool torn_down_ = false;  // provider handles destroyed
  std::uint64_t next_id_ = 1;
  RegionTable regions_;
  /// When the current progress turn began (read once per turn).
  std::chrono::steady_clock::time_point turn_time_ = std::chrono::steady_clock::now();
  std::map<std::uint64_t, std::shared_ptr<MapOp>> delayed_maps_;
  std::optional<asio::steady_timer> deadline_sweep_;
  bool sweep_armed_ = false;
};

template <class Done>
void EngineCore::progress_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + settings.shutdown_timeout;
  while (!done() && std::chrono::steady_clock::now() < deadline) progress();
}

template <class Command, class Refuse>
void EngineCore::submit(Command command, Refuse refuse) {
  if (!accepting_.load(std::memory_order_acquire)) {
    return refuse(Error{errc::shutting_down, settings.name + " backend is shut down"});
  }
  if (queued_.fetch_add(1, std::memory_order_acq_rel) >= settings.command_queue_capacity) {
    queued_.fetch_sub(1, std::memory_order_acq_rel);
    return refuse(Error{errc::backend, settings.name + " backend command queue full"});
  }
  commands_->push([this, command = std::move(command)]() mutable {
    queued_.fetch_sub(1, std::memory_order_acq_rel);
    command();
  });
}

template <class Op, class CallerCompletion, class OnCancel>
void EngineCore::watch_cancellation(const std::shared_ptr<Op>& op, const CallerCompletion& completion,
                                    asio::cancellation_type honoured, OnCancel on_cancel) {
  completion.on_cancellation(honoured, [weak_engine = weak_from_this(), weak_op = std::weak_ptr<Op>(op),
                                            on_cancel] {
    auto target = weak_op.lock();
    if (!target) return;
    target->cancelled.store(true, std::memory_order_release);
    if (auto engine = weak_engine.lock()) {
      // Through the command queue, not the io_context: a signal emitted on
      // the progress thread (inside an initiation there, say) is seen on the
      // next turn like any other. Weak inside the queue too: a message queued
      // after the loop ended must not keep the engine alive.
      engine->commands_->push([weak_engine, target, on_cancel] {
        if (auto alive = weak_engine.lock()) on_cancel(target);
      });
    }
  });
}

}  // namespace corma::backend_kit
