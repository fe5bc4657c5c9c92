#include "test_backend.hpp"

#include <corma/detail/batch_tally.hpp>
#include <corma/detail/completion.hpp>
#include <corma/detail/notification_inbox.hpp>

#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace corma::testing {

using detail::BatchTally;
using detail::Completion;

namespace {

// Every TestBackend in the process, by instance number: the "fabric" that
// offers and answers name. Never destroyed: a backend whose last reference
// drops on its own progress thread may unregister while the process exits.
struct Fabric {
  std::mutex mutex;
  std::map<std::uint64_t, std::weak_ptr<TestBackend::State>> backends;
};
Fabric& fabric() {
  static auto* instance = new Fabric;
  return *instance;
}
std::atomic<std::uint64_t> next_instance{1};

/// The packed key: which backend and region, the bytes it covers and what
/// it was registered for.
struct KeyRecord {
  static constexpr std::uint32_t magic_value = 0x314b5443;  // "CTK1"
  std::uint32_t magic = magic_value;
  std::uint32_t access = 0;  ///< the region's Access
  std::uint64_t instance = 0;
  std::uint64_t region = 0;
  std::uint64_t addr = 0;
  std::uint64_t len = 0;
};

PackedKey pack(const KeyRecord& record) {
  PackedKey key(sizeof(KeyRecord));
  std::memcpy(key.data(), &record, sizeof record);
  return key;
}

Result<KeyRecord> unpack(const PackedKey& key) {
  if (key.size() != sizeof(KeyRecord)) return fail(errc::invalid_key, "packed key has the wrong size");
  KeyRecord record;
  std::memcpy(&record, key.data(), sizeof record);
  const bool known_access = record.access == static_cast<std::uint32_t>(Access::local) ||
                            record.access == static_cast<std::uint32_t>(Access::remote_read) ||
                            record.access == static_cast<std::uint32_t>(Access::remote_read_write) ||
                            record.access == static_cast<std::uint32_t>(Access::remote_atomic);
  if (record.magic != KeyRecord::magic_value || !known_access) {
    return fail(errc::invalid_key, "packed key is not a test-backend key");
  }
  return record;
}

std::vector<std::byte> encode_u64(std::uint64_t value) {
  std::vector<std::byte> blob(sizeof value);
  std::memcpy(blob.data(), &value, sizeof value);
  return blob;
}

Result<std::uint64_t> decode_u64(const std::vector<std::byte>& blob) {
  if (blob.size() != sizeof(std::uint64_t)) return fail(errc::protocol, "peer blob has the wrong size");
  std::uint64_t value = 0;
  std::memcpy(&value, blob.data(), sizeof value);
  return value;
}

}  // namespace

struct TestBackend::State : std::enable_shared_from_this<State> {
  /// An unmap whose caller may still be waiting for the answer. Cancelling
  /// it abandons the notification only: the unmap itself proceeds.
  struct UnmapOp {
    Completion<void(Result<void>)> completion;  // empty once answered
    RegionId id{};
    /// Set by the cancellation handler on the emitting thread, before it
    /// posts: an unmap that has not run yet answers `cancelled` when it does.
    std::atomic<bool> cancel_requested{false};
  };
  struct Region {
    std::byte* addr = nullptr;
    std::size_t len = 0;
    Access access = Access::local;
    std::size_t transfers = 0;
    bool unmapping = false;
    std::vector<std::shared_ptr<UnmapOp>> unmap_waiters;
  };
  struct Peer {
    std::uint64_t remote_instance = 0;  // 0 while pending
    std::map<RemoteKeyId, KeyRecord> imported;  // copied by each transfer at admission
  };
  struct MapOp {
    Completion<void(Result<BackendRegion>)> completion;
    void* ptr = nullptr;
    std::size_t len = 0;
    Access access = Access::local;
    bool held = false;
    /// Set by the cancellation handler on the emitting thread, before it
    /// posts: a map whose command has not run yet is answered `cancelled`
    /// without ever reaching the "provider".
    std::atomic<bool> cancel_requested{false};
    std::optional<RegionId> mapped;
    std::unique_ptr<asio::steady_timer> timer;
  };
  /// Whom a transfer answers: its own caller, or the batch it is an
  /// element of. Taken out of the op under the mutex (empty once answered),
  /// delivered after.
  struct TransferAnswer {
    Completion<void(Result<void>)> completion;
    std::shared_ptr<BatchTally> batch;
    std::size_t batch_index = 0;
    Completion<void(Result<std::uint64_t>)> value_completion;  ///< an atomic's caller
    std::uint64_t fetched = 0;                                 ///< an atomic's old value

    [[nodiscard]] explicit operator bool() const noexcept { return completion || batch || value_completion; }
    void deliver(Result<void> outcome) {
      if (batch) {
        batch->element_done(batch_index, std::move(outcome));
      } else if (completion) {
        completion.dispatch(std::move(outcome));
      } else if (value_completion) {
        if (!outcome) return value_completion.dispatch(std::move(outcome).error());
        value_completion.dispatch(fetched);
      }
    }
  };
  enum class Kind : std::uint8_t { get, put, atomic, flush, notify };
  /// A get, put, atomic or flush (which names no local region, and waits
  /// for the puts to its peer admitted before it).
  struct TransferOp {
    TransferAnswer answer;
    Kind kind = Kind::get;
    TransferRequest request;  ///< an atomic's or flush's: only `peer`
    AtomicRequest atomic;
    std::uint64_t tag = 0;  ///< a notification's
    KeyRecord key;
    std::unique_ptr<asio::steady_timer> timer;
    /// Set by the cancellation handler on the emitting thread, before it
    /// posts: an op that has not run yet answers `cancelled` and never runs.
    std::atomic<bool> cancel_requested{false};
    bool admitted = false;  ///< checked and handed to the "provider" (mutex held)

    /// The answer, once (the mutex held).
    TransferAnswer take_answer() { return std::exchange(answer, TransferAnswer{}); }
    [[nodiscard]] bool local() const noexcept { return kind == Kind::get || kind == Kind::put; }
  };

  const std::uint64_t instance = next_instance++;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);

  mutable std::mutex mutex;
  std::condition_variable changed;
  TestBackendFaults faults;
  bool holding = false;
  bool holding_transfers = false;
  std::vector<std::uint64_t> held_transfers;
  bool shut_down = false;
  static constexpr std::chrono::seconds drain_limit{5};
  bool draining = false;  // shut down, waiting for transfers in flight
  std::unique_ptr<asio::steady_timer> drain_timer;
  std::vector<Completion<void(Result<void>)>> shutdown_waiters;
  std::uint64_t next_id = 1;
  std::map<RegionId, Region> regions;
  std::map<PeerId, Peer> peers;
  std::map<std::uint64_t, std::shared_ptr<MapOp>> maps;           // not yet answered
  std::map<std::uint64_t, std::shared_ptr<TransferOp>> transfers;  // not yet finished
  std::vector<std::uint64_t> flushes_waiting;                       // flushes and notifications, for earlier puts
  detail::NotificationInbox inbox;                                   // touched on the progress thread only
  std::atomic<std::uint64_t> refused_notifications{0};
  std::size_t held_count = 0;
  std::size_t cancelled_transfers = 0;
  std::size_t handed_off = 0;

  template <class Predicate>
  bool wait(std::chrono::milliseconds timeout, Predicate predicate) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return predicate(*this); });
  }

  /// Posts `fn(state)` to the progress thread if the state still exists.
  template <class Fn>
  static void post_to(const std::weak_ptr<State>& weak, Fn fn) {
    if (auto self = weak.lock()) {
      asio::post(self->io, [self, fn = std::move(fn)]() mutable { fn(*self); });
    }
  }

  /// Installs a cancellation handler on the caller's thread (where the slot
  /// lives) that forwards the `honoured` types to the progress thread.
  template <class Completion, class Fn>
  void on_cancel(const Completion& completion, asio::cancellation_type honoured, Fn fn) {
    completion.on_cancellation(honoured, [weak = weak_from_this(), fn = std::move(fn)] { post_to(weak, fn); });
  }

  /// The same, but first marks `op` cancelled on the emitting thread, so a
  /// command still queued behind other work (the progress thread is busy)
  /// sees the cancellation when it runs instead of running first.
  template <class Op, class Fn>
  void on_cancel(const std::shared_ptr<Op>& op, asio::cancellation_type honoured, Fn fn) {
    op->completion.on_cancellation(honoured, [weak = weak_from_this(), weak_op = std::weak_ptr<Op>(op),
                                              fn = std::move(fn)] {
      if (auto live_op = weak_op.lock()) live_op->cancel_requested.store(true);
      post_to(weak, fn);
    });
  }

  // ---- map / unmap (progress thread) ----

  void run_map(std::uint64_t op_id) {
    std::unique_lock lock(mutex);
    auto it = maps.find(op_id);
    if (it == maps.end()) return;  // cancelled before it ran
    auto op = it->second;
    if (op->cancel_requested.load()) return answer_map(lock, op_id, fail(errc::cancelled, "map cancelled"));
    if (shut_down) return answer_map(lock, op_id, fail(errc::shutting_down, "backend shut down"));
    if (auto valid = validate_range(op->ptr, op->len); !valid) {
      return answer_map(lock, op_id, std::move(valid).error());
    }
    const auto* start = static_cast<const std::byte*>(op->ptr);
    const auto refused = faults.refuse_maps_in;
    if (!refused.empty() && start >= refused.data() && start < refused.data() + refused.size()) {
      return answer_map(lock, op_id, fail(errc::backend, "the provider cannot register this memory"));
    }
    if (holding) {
      op->held = true;
      ++held_count;
      changed.notify_all();
      return;
    }
    const RegionId id{next_id++};
    Region& region = regions[id];
    region.addr = static_cast<std::byte*>(op->ptr);
    region.len = op->len;
    region.access = op->access;
    op->mapped = id;
    changed.notify_all();
    if (faults.map_delay.count() > 0) {
      op->timer = std::make_unique<asio::steady_timer>(io, faults.map_delay);
      op->timer->async_wait([self = shared_from_this(), op_id](boost::system::error_code ec) {
        if (ec) return;
        std::unique_lock l(self->mutex);
        self->deliver_map(l, op_id);
      });
      return;
    }
    deliver_map(lock, op_id);
  }

  void deliver_map(std::unique_lock<std::mutex>& lock, std::uint64_t op_id) {
    auto it = maps.find(op_id);
    if (it == maps.end()) return;
    auto op = it->second;
    maps.erase(it);
    const RegionId id = *op->mapped;
    const auto& region = regions.at(id);
    BackendRegion result{id, reinterpret_cast<std::uint64_t>(region.addr), region.len,
                         pack(KeyRecord{KeyRecord::magic_value, static_cast<std::uint32_t>(region.access), instance,
                                        static_cast<std::uint64_t>(id),
                                        reinterpret_cast<std::uint64_t>(region.addr), region.len})};
    lock.unlock();
    // A handler destroyed undelivered (its io_context gone) must not leave
    // the registration behind.
    op->completion.dispatch_or_rollback(
        [weak = weak_from_this(), id] {
          post_to(weak, [id](State& s) {
            std::unique_lock l(s.mutex);
            auto waiters = s.remove_region(id);
            l.unlock();
            answer_all(std::move(waiters));
          });
        },
        std::move(result));
    std::lock_guard relock(mutex);
    ++handed_off;  // counted once the result is in the handler's executor
    changed.notify_all();
  }

  void answer_map(std::unique_lock<std::mutex>& lock, std::uint64_t op_id, Result<BackendRegion> r) {
    auto it = maps.find(op_id);
    if (it == maps.end()) return;
    auto op = it->second;
    maps.erase(it);
    if (op->held) --held_count;
    Waiters waiters;
    if (op->mapped) waiters = remove_region(*op->mapped);
    if (op->timer) op->timer->cancel();
    changed.notify_all();
    lock.unlock();
    answer_all(std::move(waiters));
    op->completion.dispatch(std::move(r));
  }

  void cancel_map(std::uint64_t op_id) {
    std::unique_lock lock(mutex);
    answer_map(lock, op_id, fail(errc::cancelled, "map cancelled"));
  }

  void release_held() {
    std::vector<std::uint64_t> held;
    {
      std::lock_guard lock(mutex);
      holding = false;
      for (auto& [id, op] : maps) {
        if (op->held) {
          op->held = false;
          --held_count;
          held.push_back(id);
        }
      }
    }
    for (auto id : held) run_map(id);
  }

  /// An unmap's answer once the region is gone: success, or `cancelled`
  /// when its caller gave up waiting for it.
  struct UnmapAnswer {
    Completion<void(Result<void>)> completion;
    bool cancelled = false;
  };
  using Waiters = std::vector<UnmapAnswer>;

  /// Takes an unmap's pending answer (the caller holds the mutex).
  static void take_answer(UnmapOp& op, Waiters& into) {
    if (!op.completion) return;
    into.push_back(UnmapAnswer{std::move(op.completion), op.cancel_requested.load()});
    op.completion = {};
  }

  /// Removes a region nobody transfers into; the caller holds the mutex and
  /// answers the returned unmap waiters after releasing it.
  [[nodiscard]] Waiters remove_region(RegionId id) {
    auto it = regions.find(id);
    if (it == regions.end()) return {};
    Waiters waiters;
    for (auto& op : it->second.unmap_waiters) take_answer(*op, waiters);
    regions.erase(it);
    changed.notify_all();
    return waiters;
  }

  static void answer_all(Waiters waiters) {
    for (auto& waiter : waiters) {
      if (waiter.cancelled) {
        waiter.completion.dispatch(fail(errc::cancelled, "unmap notification abandoned; the unmap went ahead"));
      } else {
        waiter.completion.dispatch(success());
      }
    }
  }

  void run_unmap(const std::shared_ptr<UnmapOp>& op) {
    std::unique_lock lock(mutex);
    if (shut_down || faults.refuse_unmap) {
      auto completion = std::move(op->completion);
      op->completion = {};
      lock.unlock();
      if (completion) completion.dispatch(fail(errc::shutting_down, "unmap refused"));
      return;
    }
    Waiters answers;
    auto it = regions.find(op->id);
    if (it != regions.end() && it->second.transfers > 0) {
      it->second.unmapping = true;
      it->second.unmap_waiters.push_back(op);
      return;
    }
    if (it != regions.end()) answers = remove_region(op->id);  // else: idempotent
    take_answer(*op, answers);
    lock.unlock();
    answer_all(std::move(answers));
  }

  /// The caller no longer waits: answer it now; the unmap (if it waits for
  /// transfers) goes ahead regardless.
  void cancel_unmap(const std::weak_ptr<UnmapOp>& weak_op) {
    auto op = weak_op.lock();
    if (!op) return;
    Completion<void(Result<void>)> completion;
    {
      std::lock_guard lock(mutex);
      completion = std::move(op->completion);
      op->completion = {};
    }
    if (completion) completion.dispatch(fail(errc::cancelled, "unmap notification abandoned; the unmap goes ahead"));
  }

  // ---- transfers (progress thread) ----

  Result<void> admit_transfer(TransferOp& op) {
    const auto& req = op.request;
    if (shut_down) return fail(errc::shutting_down, "backend shut down");
    if (op.kind == Kind::flush || op.kind == Kind::notify) {
      CORMA_TRY(auto* peer, connected_peer(req.peer));
      op.key.instance = peer->remote_instance;  // where a notification goes
      return success();
    }
    if (op.kind == Kind::atomic) {
      CORMA_TRY(auto* peer, connected_peer(req.peer));
      CORMA_TRY(op.key, find_key(*peer, op.atomic.key));
      return validate_atomic_word(op.atomic.remote_addr, op.key.addr, op.key.len, static_cast<Access>(op.key.access));
    }
    if (req.len == 0) return fail(errc::out_of_range, "zero-length transfer");
    auto local = regions.find(req.local);
    if (local == regions.end() || local->second.unmapping) {
      return fail(errc::region_not_found, "local region is not registered");
    }
    CORMA_TRY(validate_local_range(req, local->second.len));
    CORMA_TRY(auto* peer, connected_peer(req.peer));
    CORMA_TRY(op.key, find_key(*peer, req.key));
    CORMA_TRY(validate_remote_range(op.kind == Kind::put, req, op.key.addr, op.key.len,
                                    static_cast<Access>(op.key.access)));
    ++local->second.transfers;
    return success();
  }

  /// The key a transfer names: imported for `peer`, or packed (mutex held).
  static Result<KeyRecord> find_key(const Peer& peer, const TransferKey& named) {
    if (const auto* id = std::get_if<RemoteKeyId>(&named)) {
      auto imported = peer.imported.find(*id);
      if (imported == peer.imported.end()) return fail(errc::invalid_key, "no key imported under that id for this peer");
      return imported->second;
    }
    return unpack_for(peer, std::get<PackedKey>(named));
  }

  /// A peer transfers and imports may use (the mutex held).
  Result<Peer*> connected_peer(PeerId id) {
    auto peer = peers.find(id);
    if (peer == peers.end() || peer->second.remote_instance == 0) {
      return fail(errc::peer_unreachable, "unknown or unconnected peer");
    }
    return &peer->second;
  }

  /// Checks a packed key the way a provider would, for `peer`.
  static Result<KeyRecord> unpack_for(const Peer& peer, const PackedKey& packed) {
    if (packed.empty() || packed.size() > max_packed_key_size) {
      return fail(errc::invalid_key, "packed key is empty or oversized");
    }
    CORMA_TRY(auto key, unpack(packed));
    if (key.instance != peer.remote_instance) return fail(errc::invalid_key, "packed key belongs to another peer");
    return key;
  }

  Result<RemoteKeyId> import_key(PeerId peer_id, const PackedKey& packed) {
    std::lock_guard lock(mutex);
    if (shut_down) return fail(errc::shutting_down, "backend shut down");
    CORMA_TRY(auto* peer, connected_peer(peer_id));
    if (peer->imported.size() >= max_imported_keys_per_peer) {
      return fail(errc::budget_exceeded, "the peer's imported-key table is full");
    }
    CORMA_TRY(auto key, unpack_for(*peer, packed));
    const RemoteKeyId id{next_id++};
    peer->imported.emplace(id, key);
    return id;
  }

  Result<void> release_key(RemoteKeyId key) {
    std::lock_guard lock(mutex);
    if (shut_down) return fail(errc::shutting_down, "backend shut down");
    for (auto& [id, peer] : peers) {
      if (peer.imported.erase(key) != 0) break;
    }
    return success();  // idempotent
  }

  /// Answers a transfer that has not run with `error`; it never runs.
  void refuse_transfer(std::uint64_t op_id, Error error) {
    std::unique_lock lock(mutex);
    refuse_transfer(lock, op_id, std::move(error));
  }
  void refuse_transfer(std::unique_lock<std::mutex>& lock, std::uint64_t op_id, Error error) {
    auto it = transfers.find(op_id);
    if (it == transfers.end()) return;  // drained at shutdown: answered there
    auto op = it->second;
    transfers.erase(it);
    changed.notify_all();
    const bool drained = last_to_drain();
    auto answer = op->take_answer();
    lock.unlock();
    answer.deliver(std::move(error));
    if (drained) finish_shutdown();
  }

  void run_transfer(std::uint64_t op_id) {
    std::unique_lock lock(mutex);
    auto op = transfers.at(op_id);
    Result<void> admitted = op->cancel_requested.load() ? Result<void>(fail(errc::cancelled, "cancelled before it ran"))
                                                        : admit_transfer(*op);
    if (!admitted) return refuse_transfer(lock, op_id, std::move(admitted).error());
    op->admitted = true;
    changed.notify_all();
    if (op->kind == Kind::flush || op->kind == Kind::notify) {
      if (puts_before(op_id, op->request.peer)) return flushes_waiting.push_back(op_id);
      lock.unlock();
      return puts_done(op_id);
    }
    if (holding_transfers) {
      held_transfers.push_back(op_id);
      return;
    }
    if (faults.transfer_delay.count() > 0) {
      op->timer = std::make_unique<asio::steady_timer>(io, faults.transfer_delay);
      op->timer->async_wait([self = shared_from_this(), op_id](boost::system::error_code) {
        self->execute_transfer(op_id);
      });
      return;
    }
    lock.unlock();
    execute_transfer(op_id);
  }

  /// Transfers admitted and not yet finished (mutex held).
  [[nodiscard]] std::size_t admitted_transfers() const {
    return static_cast<std::size_t>(
        std::count_if(transfers.begin(), transfers.end(), [](const auto& entry) { return entry.second->admitted; }));
  }

  /// Whether a put to `peer` admitted before `op_id` is still in flight (mutex held).
  [[nodiscard]] bool puts_before(std::uint64_t op_id, PeerId peer) const {
    for (auto it = transfers.begin(); it != transfers.end() && it->first < op_id; ++it) {
      if (it->second->kind == Kind::put && it->second->request.peer == peer) return true;
    }
    return false;
  }

  /// Applies an atomic to the target's word (its lock held).
  static std::uint64_t apply_atomic(const AtomicRequest& atomic, std::byte* remote) {
    std::atomic_ref<std::uint64_t> word(*reinterpret_cast<std::uint64_t*>(remote));
    switch (atomic.op) {
      case AtomicOp::add:
        word.fetch_add(atomic.operand);
        return 0;
      case AtomicOp::fetch_add: return word.fetch_add(atomic.operand);
      case AtomicOp::swap: return word.exchange(atomic.operand);
      case AtomicOp::compare_swap: {
        std::uint64_t expected = atomic.compare;
        word.compare_exchange_strong(expected, atomic.operand);
        return expected;
      }
    }
    return 0;
  }

  /// Moves the bytes (or applies the atomic) under the target's lock, as a
  /// NIC checks the rkey against the target's live registrations.
  Result<void> copy_bytes(TransferOp& op, std::byte* local) {
    if (std::lock_guard lock(mutex); faults.fail_transfers) {
      return fail(errc::backend, "injected transfer failure");
    }
    std::shared_ptr<State> target;
    {
      std::lock_guard lock(fabric().mutex);
      auto it = fabric().backends.find(op.key.instance);
      if (it != fabric().backends.end()) target = it->second.lock();
    }
    if (!target) return fail(errc::peer_unreachable, "peer is gone");
    std::lock_guard lock(target->mutex);
    if (target->shut_down) return fail(errc::peer_unreachable, "peer shut down");
    auto it = target->regions.find(RegionId{op.key.region});
    const auto need = op.kind == Kind::atomic ? Access::remote_atomic
                      : op.kind == Kind::put  ? Access::remote_read_write
                                              : Access::remote_read;
    if (it == target->regions.end() || reinterpret_cast<std::uint64_t>(it->second.addr) != op.key.addr ||
        it->second.len != op.key.len || !access_allows(it->second.access, need)) {
      return fail(errc::backend, "remote access error");
    }
    if (op.kind == Kind::atomic) {
      op.answer.fetched = apply_atomic(op.atomic, it->second.addr + (op.atomic.remote_addr - op.key.addr));
      return success();
    }
    const auto& req = op.request;
    for (std::uint64_t i = 0; i < req.blocks; ++i) {
      std::byte* remote = it->second.addr + (req.remote_addr_of(i) - op.key.addr);
      std::byte* here = local + (req.local_offset_of(i) - req.local_offset);
      if (op.kind == Kind::put) {
        std::memmove(remote, here, req.len);
      } else {
        std::memmove(here, remote, req.len);
      }
    }
    return success();
  }

  void execute_transfer(std::uint64_t op_id) {
    std::shared_ptr<TransferOp> op;
    std::byte* local = nullptr;
    {
      std::lock_guard lock(mutex);
      auto it = transfers.find(op_id);
      if (it == transfers.end()) return;
      op = it->second;
      // Pinned by admit_transfer: the region cannot have gone.
      if (op->local()) local = regions.at(op->request.local).addr + op->request.local_offset;
    }
    // Admitted before any shutdown: it drains, with its real result.
    finish_transfer(op_id, copy_bytes(*op, local));
  }

  void finish_transfer(std::uint64_t op_id, Result<void> outcome) {
    std::unique_lock lock(mutex);
    auto it = transfers.find(op_id);
    if (it == transfers.end()) return;
    auto op = it->second;
    transfers.erase(it);
    auto region = op->local() ? regions.find(op->request.local) : regions.end();
    Waiters waiters;
    if (region != regions.end() && --region->second.transfers == 0 && region->second.unmapping) {
      waiters = remove_region(op->request.local);
    }
    const auto flushed = op->kind == Kind::put ? flushes_now_done() : std::vector<std::uint64_t>{};
    changed.notify_all();
    const bool drained = last_to_drain();
    auto answer = op->take_answer();
    lock.unlock();
    // The transfer ended before the unmap did: answer in that order.
    answer.deliver(std::move(outcome));
    answer_all(std::move(waiters));
    for (auto flush : flushed) puts_done(flush);
    if (drained) finish_shutdown();
  }

  /// A flush or notification whose earlier puts are all done: the flush is,
  /// and the notification goes to the target's progress thread, which
  /// queues it if it accepted this side and answers back.
  void puts_done(std::uint64_t op_id) {
    std::shared_ptr<TransferOp> op;
    {
      std::lock_guard lock(mutex);
      auto it = transfers.find(op_id);
      if (it == transfers.end()) return;
      op = it->second;
    }
    if (op->kind == Kind::flush) return finish_transfer(op_id, success());
    std::shared_ptr<State> target;
    {
      std::lock_guard lock(fabric().mutex);
      auto it = fabric().backends.find(op->key.instance);
      if (it != fabric().backends.end()) target = it->second.lock();
    }
    if (!target) return finish_transfer(op_id, fail(errc::peer_unreachable, "peer is gone"));
    asio::post(target->io, [target, sender = weak_from_this(), from = instance, tag = op->tag, op_id] {
      auto queued = target->accept_notification(from, tag);
      post_to(sender, [op_id, queued](State& s) { s.finish_transfer(op_id, queued); });
    });
  }

  /// On this (the target's) progress thread: a notification from backend
  /// instance `from`, queued if this side is connected to it.
  Result<void> accept_notification(std::uint64_t from, std::uint64_t tag) {
    std::optional<PeerId> sender;
    {
      std::lock_guard lock(mutex);
      if (shut_down) return fail(errc::peer_unreachable, "peer shut down");
      for (const auto& [id, peer] : peers) {
        if (peer.remote_instance == from) sender = id;
      }
    }
    if (!sender) {
      refused_notifications.fetch_add(1);
      return fail(errc::peer_unreachable, "the target does not accept notifications from this side");
    }
    return inbox.deliver(Notification{*sender, tag});
  }

  /// The waiting flushes no earlier put holds back any more, taken off the
  /// list (mutex held); flushes a shutdown already failed just leave it.
  std::vector<std::uint64_t> flushes_now_done() {
    std::vector<std::uint64_t> done;
    std::erase_if(flushes_waiting, [&](std::uint64_t id) {
      auto flush = transfers.find(id);
      if (flush == transfers.end()) return true;
      if (puts_before(id, flush->second->request.peer)) return false;
      done.push_back(id);
      return true;
    });
    return done;
  }

  /// Whether a shutdown waits for transfers and none is left (mutex held).
  [[nodiscard]] bool last_to_drain() const { return draining && transfers.empty(); }

  void cancel_transfer(std::uint64_t op_id) {
    TransferAnswer answer;
    {
      std::lock_guard lock(mutex);
      auto it = transfers.find(op_id);
      if (it == transfers.end()) return;
      // The transfer itself runs on; only the caller is released.
      answer = it->second->take_answer();
      if (answer) ++cancelled_transfers;
    }
    answer.deliver(fail(errc::cancelled, "transfer cancelled"));
  }

  // ---- shutdown (progress thread) ----

  /// The provider backends' order (docs/backends.md, "Shutdown order"):
  /// refuse new work at once, undo maps not yet answered, give transfers in
  /// flight until `drain_limit` to end (held ones until released), then fail
  /// what is left, unmap everything and answer. While it drains, the backend
  /// still holds registrations it already refuses to unmap. `force` (the
  /// destructor) does not wait.
  void run_shutdown(Completion<void(Result<void>)> done, bool force) {
    inbox.close(Error{errc::shutting_down, "backend shut down"});
    {
      std::unique_lock lock(mutex);
      shut_down = true;
      if (done) shutdown_waiters.push_back(std::move(done));
      std::vector<std::uint64_t> ids;
      for (auto& [id, op] : maps) ids.push_back(id);
      for (auto id : ids) {
        answer_map(lock, id, fail(errc::shutting_down, "backend shut down"));
        lock.lock();
      }
      if (!force && !transfers.empty()) {
        if (!draining) {
          draining = true;
          drain_timer = std::make_unique<asio::steady_timer>(io, drain_limit);
          drain_timer->async_wait([self = shared_from_this()](boost::system::error_code ec) {
            if (!ec) self->finish_shutdown();
          });
        }
        return;
      }
    }
    finish_shutdown();
  }

  /// Ends a shutdown once its transfers drained (or ran out of time): fails
  /// the transfers still in flight, unmaps everything, answers the callers.
  void finish_shutdown() {
    std::vector<std::uint64_t> pending_transfers;
    {
      std::lock_guard lock(mutex);
      draining = false;
      if (drain_timer) drain_timer->cancel();
      for (auto& [id, op] : transfers) pending_transfers.push_back(id);
    }
    for (auto id : pending_transfers) finish_transfer(id, fail(errc::shutting_down, "backend shut down"));
    Waiters waiters;
    std::vector<Completion<void(Result<void>)>> done;
    {
      std::lock_guard lock(mutex);
      std::vector<RegionId> ids;
      for (auto& [id, region] : regions) ids.push_back(id);
      for (auto id : ids) {
        for (auto& waiter : remove_region(id)) waiters.push_back(std::move(waiter));
      }
      peers.clear();
      done.swap(shutdown_waiters);
    }
    answer_all(std::move(waiters));
    for (auto& completion : done) completion.dispatch(success());
  }
};

std::shared_ptr<TestBackend> TestBackend::create() {
  return std::shared_ptr<TestBackend>(new TestBackend());
}

TestBackend::TestBackend() : state_(std::make_shared<State>()) {
  {
    std::lock_guard lock(fabric().mutex);
    fabric().backends[state_->instance] = state_;
  }
  thread_ = std::thread([state = state_] { state->io.run(); });
}

TestBackend::~TestBackend() {
  {
    std::lock_guard lock(fabric().mutex);
    fabric().backends.erase(state_->instance);
  }
  asio::post(state_->io, [state = state_] {
    state->run_shutdown({}, true);
    state->work.reset();
  });
  // The last reference can be dropped by a completion running on our own
  // progress thread: that thread then finishes by itself.
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

asio::any_io_executor TestBackend::progress_executor() const { return state_->io.get_executor(); }

std::optional<std::size_t> TestBackend::live_registrations() const {
  std::lock_guard lock(state_->mutex);
  return state_->regions.size();
}

void TestBackend::set_faults(const TestBackendFaults& faults) {
  std::lock_guard lock(state_->mutex);
  state_->faults = faults;
}

void TestBackend::hold_maps() {
  std::lock_guard lock(state_->mutex);
  state_->holding = true;
}

void TestBackend::release_maps() {
  asio::post(state_->io, [state = state_] { state->release_held(); });
}

void TestBackend::hold_transfers() {
  std::lock_guard lock(state_->mutex);
  state_->holding_transfers = true;
}

void TestBackend::release_transfers() {
  asio::post(state_->io, [state = state_] {
    std::vector<std::uint64_t> held;
    {
      std::lock_guard lock(state->mutex);
      state->holding_transfers = false;
      held.swap(state->held_transfers);
    }
    for (auto id : held) state->execute_transfer(id);
  });
}

std::size_t TestBackend::held_maps() const {
  std::lock_guard lock(state_->mutex);
  return state_->held_count;
}

std::size_t TestBackend::transfers_cancelled() const {
  std::lock_guard lock(state_->mutex);
  return state_->cancelled_transfers;
}

std::size_t TestBackend::transfers_in_flight() const {
  std::lock_guard lock(state_->mutex);
  return state_->admitted_transfers();
}

std::size_t TestBackend::open_peers() const {
  std::lock_guard lock(state_->mutex);
  return state_->peers.size();
}

std::size_t TestBackend::imported_keys() const {
  std::lock_guard lock(state_->mutex);
  std::size_t count = 0;
  for (const auto& [id, peer] : state_->peers) count += peer.imported.size();
  return count;
}

std::size_t TestBackend::maps_handed_off() const {
  std::lock_guard lock(state_->mutex);
  return state_->handed_off;
}

bool TestBackend::wait_for_live(std::size_t n, std::chrono::milliseconds timeout) {
  return state_->wait(timeout, [n](const State& s) { return s.regions.size() == n; });
}

bool TestBackend::wait_for_held_maps(std::size_t n, std::chrono::milliseconds timeout) {
  return state_->wait(timeout, [n](const State& s) { return s.held_count == n; });
}

bool TestBackend::wait_for_transfers_in_flight(std::size_t n, std::chrono::milliseconds timeout) {
  return state_->wait(timeout, [n](const State& s) { return s.admitted_transfers() == n; });
}

bool TestBackend::wait_for_maps_handed_off(std::size_t n, std::chrono::milliseconds timeout) {
  return state_->wait(timeout, [n](const State& s) { return s.handed_off >= n; });
}

void TestBackend::do_map(void* ptr, std::size_t len, Access access, Handler<BackendRegion> h) {
  auto op = std::make_shared<State::MapOp>();
  op->completion = Completion<void(Result<BackendRegion>)>(std::move(h));
  op->ptr = ptr;
  op->len = len;
  op->access = access;
  std::uint64_t op_id = 0;
  {
    std::lock_guard lock(state_->mutex);
    op_id = state_->next_id++;
    state_->maps.emplace(op_id, op);
  }
  state_->on_cancel(op, detail::any_cancellation, [op_id](State& s) { s.cancel_map(op_id); });
  asio::post(state_->io, [state = state_, op_id] { state->run_map(op_id); });
}

void TestBackend::do_unmap(RegionId id, Handler<void> h) {
  auto op = std::make_shared<State::UnmapOp>();
  op->completion = Completion<void(Result<void>)>(std::move(h));
  op->id = id;
  state_->on_cancel(op, detail::terminal_only,
                    [weak_op = std::weak_ptr<State::UnmapOp>(op)](State& s) { s.cancel_unmap(weak_op); });
  asio::post(state_->io, [state = state_, op] { state->run_unmap(op); });
}

void TestBackend::do_get(GetRequest request, Handler<void> h) { transfer(false, std::move(request), std::move(h)); }
void TestBackend::do_put(PutRequest request, Handler<void> h) { transfer(true, std::move(request), std::move(h)); }

namespace {

/// Admits any transfer op (get, put, atomic, flush) and runs it on the
/// progress thread; `caller` is the completion its cancellation reaches.
template <class CallerCompletion>
void submit(const std::shared_ptr<TestBackend::State>& state, const std::shared_ptr<TestBackend::State::TransferOp>& op,
            const CallerCompletion& caller) {
  std::uint64_t op_id = 0;
  {
    std::lock_guard lock(state->mutex);
    op_id = state->next_id++;
    state->transfers.emplace(op_id, op);
  }
  // The operation runs on (its bytes may land); only its caller is released.
  caller.on_cancellation(detail::terminal_only, [weak = std::weak_ptr(state), weak_op = std::weak_ptr(op), op_id] {
    if (auto live_op = weak_op.lock()) live_op->cancel_requested.store(true);
    TestBackend::State::post_to(weak, [op_id](TestBackend::State& s) { s.cancel_transfer(op_id); });
  });
  asio::post(state->io, [state, op_id] { state->run_transfer(op_id); });
}

}  // namespace

void TestBackend::transfer(bool is_put, TransferRequest request, Handler<void> h) {
  auto op = std::make_shared<State::TransferOp>();
  op->answer.completion = Completion<void(Result<void>)>(std::move(h));
  op->kind = is_put ? State::Kind::put : State::Kind::get;
  op->request = std::move(request);
  submit(state_, op, op->answer.completion);
}

void TestBackend::do_atomic(AtomicRequest request, Handler<std::uint64_t> h) {
  auto op = std::make_shared<State::TransferOp>();
  op->answer.value_completion = Completion<void(Result<std::uint64_t>)>(std::move(h));
  op->kind = State::Kind::atomic;
  op->request.peer = request.peer;
  op->atomic = std::move(request);
  submit(state_, op, op->answer.value_completion);
}

void TestBackend::do_notify(PeerId peer, std::uint64_t tag, Handler<void> h) {
  auto op = std::make_shared<State::TransferOp>();
  op->answer.completion = Completion<void(Result<void>)>(std::move(h));
  op->kind = State::Kind::notify;
  op->request.peer = peer;
  op->tag = tag;
  submit(state_, op, op->answer.completion);
}

void TestBackend::do_receive_notification(Handler<Notification> h) {
  auto receiver = std::make_shared<detail::NotificationInbox::Receiver>();
  receiver->completion = Completion<void(Result<Notification>)>(std::move(h));
  // A cancelled receive takes nothing: every cancellation type is honoured.
  receiver->completion.on_cancellation(detail::any_cancellation, [weak = std::weak_ptr(state_),
                                                                  weak_receiver = std::weak_ptr(receiver)] {
    auto target = weak_receiver.lock();
    if (!target) return;
    target->cancelled.store(true);
    State::post_to(weak, [target](State& s) { s.inbox.cancel(target); });
  });
  asio::post(state_->io, [state = state_, receiver] { state->inbox.receive(receiver, state->io.get_executor()); });
}

std::uint64_t TestBackend::refused_notifications() const { return state_->refused_notifications.load(); }

void TestBackend::do_flush(PeerId peer, Handler<void> h) {
  auto op = std::make_shared<State::TransferOp>();
  op->answer.completion = Completion<void(Result<void>)>(std::move(h));
  op->kind = State::Kind::flush;
  op->request.peer = peer;
  submit(state_, op, op->answer.completion);
}


void TestBackend::do_get_batch(TransferBatch batch, Handler<BatchOutcome> h) {
  transfer_batch(false, std::move(batch), std::nullopt, std::move(h));
}
void TestBackend::do_put_batch(TransferBatch batch, std::optional<BatchNotification> notification,
                               Handler<BatchOutcome> h) {
  transfer_batch(true, std::move(batch), notification, std::move(h));
}

// Each element is a transfer of its own (admitted, held, delayed, cancelled
// and drained like one), answering the batch's tally; one command runs them.
void TestBackend::transfer_batch(bool is_put, TransferBatch batch, std::optional<BatchNotification> notification,
                                 Handler<BatchOutcome> h) {
  const std::size_t transfers = batch.size();
  auto tally = std::make_shared<BatchTally>(BatchTally::BatchCompletion(std::move(h)),
                                            transfers + (notification ? 1 : 0));
  if (auto fits = validate_batch_size(transfers); !fits) return tally->refuse(progress_executor(), std::move(fits).error());
  if (batch.empty() && !notification) return tally->answer_empty(progress_executor());
  std::vector<std::uint64_t> ids;
  ids.reserve(transfers + 1);
  // Each put's peer, for the notification's check below: read here, under
  // the lock, because the progress thread may be retiring earlier transfers
  // from the map as soon as the lock is released.
  std::vector<PeerId> put_peers;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->shut_down) return tally->refuse(progress_executor(), Error{errc::shutting_down, "backend shut down"});
    const auto add = [&](std::shared_ptr<State::TransferOp> op) {
      op->answer.batch = tally;
      op->answer.batch_index = ids.size();
      ids.push_back(state_->next_id++);
      state_->transfers.emplace(ids.back(), std::move(op));
    };
    for (auto& request : batch) {
      auto op = std::make_shared<State::TransferOp>();
      op->kind = is_put ? State::Kind::put : State::Kind::get;
      op->request = std::move(request);
      if (notification) put_peers.push_back(op->request.peer);
      add(std::move(op));
    }
    if (notification) {
      auto op = std::make_shared<State::TransferOp>();
      op->kind = State::Kind::notify;
      op->request.peer = notification->peer;
      op->tag = notification->tag;
      add(std::move(op));
    }
  }
  state_->on_cancel(tally->completion(), detail::terminal_only, [ids](State& s) {
    for (auto id : ids) s.cancel_transfer(id);
  });
  // The notification runs after every put, unless a put to its peer was
  // refused before it ran: then it fails with that put's error, unsent.
  asio::post(state_->io, [state = state_, ids, tally, put_peers = std::move(put_peers), notification] {
    for (std::size_t i = 0; i < put_peers.size() || (!notification && i < ids.size()); ++i) state->run_transfer(ids[i]);
    if (!notification) return;
    for (std::size_t i = 0; i < put_peers.size(); ++i) {
      if (put_peers[i] != notification->peer || !tally->error_of(i)) continue;
      auto refused = *tally->error_of(i);
      return state->refuse_transfer(ids.back(), Error{refused.code, "notification not sent: " + refused.detail});
    }
    state->run_transfer(ids.back());
  });
}

void TestBackend::do_import_key(PeerId peer, PackedKey packed_key, Handler<RemoteKeyId> h) {
  asio::post(state_->io, [state = state_, peer, packed_key = std::move(packed_key),
                          c = Completion<void(Result<RemoteKeyId>)>(std::move(h))]() mutable {
    c.dispatch(state->import_key(peer, packed_key));
  });
}

void TestBackend::do_release_key(RemoteKeyId key, Handler<void> h) {
  asio::post(state_->io, [state = state_, key, c = Completion<void(Result<void>)>(std::move(h))]() mutable {
    c.dispatch(state->release_key(key));
  });
}

void TestBackend::do_peer_offer(Handler<PeerOffer> h) {
  asio::post(state_->io, [state = state_, c = Completion<void(Result<PeerOffer>)>(std::move(h))]() mutable {
    std::unique_lock lock(state->mutex);
    if (state->shut_down) {
      lock.unlock();
      return c.dispatch(fail(errc::shutting_down, "backend shut down"));
    }
    const PeerId peer{state->next_id++};
    state->peers[peer] = State::Peer{};
    lock.unlock();
    c.dispatch(PeerOffer{peer, encode_u64(state->instance)});
  });
}

void TestBackend::do_peer_accept(std::vector<std::byte> offer, Handler<PeerAnswer> h) {
  asio::post(state_->io, [state = state_, offer = std::move(offer),
                          c = Completion<void(Result<PeerAnswer>)>(std::move(h))]() mutable {
    auto remote = decode_u64(offer);
    if (!remote) return c.dispatch(std::move(remote).error());
    std::unique_lock lock(state->mutex);
    if (state->shut_down) {
      lock.unlock();
      return c.dispatch(fail(errc::shutting_down, "backend shut down"));
    }
    const PeerId peer{state->next_id++};
    state->peers[peer] = State::Peer{remote.value(), {}};
    lock.unlock();
    c.dispatch(PeerAnswer{peer, encode_u64(state->instance)});
  });
}

void TestBackend::do_peer_complete(PeerId peer, std::vector<std::byte> answer, Handler<void> h) {
  asio::post(state_->io, [state = state_, peer, answer = std::move(answer),
                          c = Completion<void(Result<void>)>(std::move(h))]() mutable {
    auto remote = decode_u64(answer);
    if (!remote) return c.dispatch(std::move(remote).error());
    std::unique_lock lock(state->mutex);
    auto it = state->peers.find(peer);
    if (it == state->peers.end()) {
      lock.unlock();
      return c.dispatch(fail(errc::peer_unreachable, "no pending peer with that id"));
    }
    it->second.remote_instance = remote.value();
    lock.unlock();
    c.dispatch(success());
  });
}

void TestBackend::do_peer_close(PeerId peer, Handler<void> h) {
  asio::post(state_->io, [state = state_, peer, c = Completion<void(Result<void>)>(std::move(h))]() mutable {
    {
      std::lock_guard lock(state->mutex);
      state->peers.erase(peer);
    }
    c.dispatch(success());
  });
}

void TestBackend::do_shutdown(Handler<void> h) {
  asio::post(state_->io, [state = state_, c = Completion<void(Result<void>)>(std::move(h))]() mutable {
    state->run_shutdown(std::move(c), false);
  });
}

}  // namespace corma::testing
