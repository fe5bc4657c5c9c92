// The verbs backend's engine: the provider half of a backend_kit::TransferEngine.
// It owns the device context, protection domain, completion channel, the
// send and receive completion queues, the atomic scratch area, and one RC
// queue pair per peer with its mailbox (mailbox.hpp); only the progress
// thread touches them, always through the IbvApi table. Notifications are
// in notifications.cpp.
#pragma once

#include "backend_kit/transfer_engine.hpp"
#include "chunk_plan.hpp"
#include "device.hpp"
#include "ibv_api.hpp"
#include "mailbox.hpp"
#include "wire.hpp"

#include <corma/verbs.hpp>

#include <boost/asio/posix/stream_descriptor.hpp>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <vector>

namespace corma::verbs {

namespace asio = boost::asio;
using backend_kit::TransferOp;
using backend_kit::ValueOp;
using backend_kit::VoidOp;

/// A get or put (a work request per chunk), an atomic (an 8-byte work
/// request per try), a flush (none: it waits for its peer's earlier work),
/// or a notification (one SEND, then the target's acknowledgement).
struct VerbsTransferOp : TransferOp {
  static constexpr std::uint32_t no_slot = ~std::uint32_t{0};

  ChunkPlan plan{0, 0};
  std::uint64_t posted = 0;     // work requests handed to the queue pair
  std::uint64_t completed = 0;  // completions seen (or chunks given up unposted)
  std::uint32_t rkey = 0;
  std::uint32_t lkey = 0;
  std::byte* local = nullptr;  // the transfer's first local byte
  std::optional<Error> failure;
  /// Its number among the work admitted to its peer (from 1), which the
  /// peer's flushes count by; 0 for a flush, which nothing waits for.
  std::uint64_t admission = 0;
  /// An atomic's compare-and-swap operand: the caller's for compare_swap;
  /// for swap, the value the word is believed to hold (0, then what the
  /// last miss returned).
  std::uint64_t compare = 0;
  /// The scratch word an atomic's posted work request returns the old
  /// value into; no_slot while none is posted.
  std::uint32_t scratch_slot = no_slot;
  /// A notification's mailbox send slot while its SEND is posted.
  std::uint32_t send_slot = no_slot;
  /// A notification posted, holding a place in its peer's window until it
  /// is acknowledged (or fails).
  bool in_window = false;
  bool acknowledged = false;
};

struct Backend::Engine final : backend_kit::TransferEngine<VerbsTransferOp> {
  /// A tracked flush and the work it waits for: the peer's admissions up to
  /// `last`, of which `remaining` are not finished.
  struct WaitingFlush {
    std::uint64_t id = 0;
    std::uint64_t last = 0;
    std::uint64_t remaining = 0;
  };

  /// An acknowledgement to send, and the receive its notification came in,
  /// reposted once the acknowledgement is posted (the credit it returns).
  struct AckDue {
    wire::AckMessage ack;
    std::uint32_t receive_slot = 0;
  };

  struct Peer {
    PeerId id{};
    Mailbox mailbox;  // declared before the queue pair, so that it goes after it
    OwnedQp qp;
    wire::QpEndpoint local;  // what this side told the other
    bool connected = false;
    bool broken = false;             // in (or moved to) the error state
    /// async_peer_close'd: refuses everything. Until it is broken it stays
    /// connected, receive-only, refusing notifications (see linger()).
    bool closed = false;
    std::uint32_t outstanding = 0;   // posted send work requests not yet completed
    std::uint32_t acks_in_flight = 0;  // of which acknowledgements
    std::uint32_t receives_posted = 0;
    /// Notifications posted to this peer and not finished (Mailbox::window at most).
    std::uint32_t notifications_in_flight = 0;
    std::deque<AckDue> acks_due;  // waiting for send-queue room or a slot
    /// Transfers with chunks not yet posted, in order: posted as completions
    /// free send-queue slots.
    std::deque<std::shared_ptr<VerbsTransferOp>> backlog;
    bool pump_due = false;  // listed in peers_to_pump
    std::shared_ptr<VoidOp> close_waiter;  // peer_close waiting for the flush
    /// Gets, puts and atomics admitted to this peer so far (their
    /// `admission` numbers), and how many of them are not finished.
    std::uint64_t admitted = 0;
    std::uint64_t unfinished = 0;
    /// Flushes waiting for earlier work, in admission order: each finishes
    /// after the ones before it, since it waits for all they wait for.
    std::deque<WaitingFlush> flushes;
    /// Keys imported for this peer, decoded once. A transfer copies what it
    /// needs at admission, so a release takes effect at once.
    std::map<RemoteKeyId, wire::RemoteKey> imported;
  };

  Engine(const Config& config, std::shared_ptr<const IbvApi> api);
  /// Starts the progress thread over `api` and wraps the engine in a Backend.
  [[nodiscard]] static Result<std::shared_ptr<Backend>> start_backend(const Config& config,
                                                                      std::shared_ptr<const IbvApi> api);

  /// Opens the device and creates the PD, channel and CQ (progress thread).
  Result<void> start();

  // Engine hooks (progress thread).
  Result<Registration> provider_map(void* ptr, std::size_t len, Access access) override;
  Result<void> provider_unmap(void* handle) override;
  void run_transfer(const std::shared_ptr<VerbsTransferOp>& op) override;
  void run_atomic(const std::shared_ptr<VerbsTransferOp>& op) override;
  void run_flush(const std::shared_ptr<VerbsTransferOp>& op) override;
  void run_notify(const std::shared_ptr<VerbsTransferOp>& op) override;  // notifications.cpp
  void on_transfer_deadline(VerbsTransferOp& op) override;
  void run_import_key(const std::shared_ptr<ValueOp<RemoteKeyId>>& op) override;
  void run_release_key(const std::shared_ptr<VoidOp>& op, RemoteKeyId key) override;
  void run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op) override;
  void run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op) override;
  void run_peer_complete(const std::shared_ptr<ValueOp<void>>& op) override;
  void run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id) override;
  void close_peers() override;
  void tear_down() override;
  std::size_t progress() override;
  bool arm_for_sleep() override;

  // Queue pairs (progress thread).
  Result<OwnedQp> create_qp();
  Result<void> connect_qp(ibv_qp* qp, const wire::QpEndpoint& local, const wire::QpEndpoint& remote);
  /// Whether the receive CQ has room for another peer's receive queue.
  [[nodiscard]] Result<void> room_for_peer() const;
  /// Records a peer over a queue pair in INIT, with its mailbox and its
  /// receives posted.
  Result<PeerId> add_peer(OwnedQp qp, const wire::QpEndpoint& local);
  void destroy_peer(std::map<PeerId, Peer>::iterator it);
  /// Nothing of the peer's is posted any more: a closed peer may go.
  [[nodiscard]] static bool drained(const Peer& peer) noexcept {
    return peer.outstanding == 0 && peer.receives_posted == 0;
  }
  /// Moves the peer's queue pair to the error state (its posted work
  /// flushes) and fails what was never posted.
  void break_peer(Peer& peer, const Error& why);
  /// Fails what the peer will now never do: its unposted backlog, its
  /// waiting flushes, its notifications still waiting for an acknowledgement.
  void stop_sending(Peer& peer, const Error& why);
  /// A closed peer with only acknowledgements in flight stays connected,
  /// receive-only (no remote access), refusing what it still sends; false
  /// when it cannot (then it is broken and destroyed once drained).
  bool linger(Peer& peer, const Error& why);

  /// Registers the atomic scratch area (start, on a device with atomics).
  Result<void> register_scratch();
  /// What an atomic, or a map for atomics, answers on a device without them.
  [[nodiscard]] Error no_atomics() const;

  // Transfers (progress thread).
  Result<void> admit_remote(VerbsTransferOp& op) const;
  /// An atomic's checks, all before any work request: the device has
  /// atomics, the peer is usable, the key names the word and allows atomics.
  Result<void> admit_atomic(VerbsTransferOp& op) const;
  /// An atomic's or a flush's first checks: not cancelled, not shut down.
  Result<void> still_wanted(const VerbsTransferOp& op) const;
  /// The peer a transfer or an import may use: known, connected, healthy.
  Result<const Peer*> usable_peer(PeerId id) const;
  /// Queues a tracked transfer or atomic behind its peer's earlier work,
  /// numbered for the peer's flushes.
  void enqueue(const std::shared_ptr<VerbsTransferOp>& op);
  /// Queues tracked work behind its peer's earlier work, to be posted at
  /// this turn's pump.
  void push_backlog(const std::shared_ptr<VerbsTransferOp>& op, Peer& peer);
  /// Lists the peer for pump_pending() (once).
  void schedule_pump(PeerId id, Peer& peer);
  /// Pumps the peers given transfers or freed room since the last call.
  void pump_pending();
  /// Posts due acknowledgements, then backlog chunks, while the send and
  /// completion queues have room.
  void pump(Peer& peer);
  /// Work requests the peer may post now: send-queue and CQ room.
  std::uint32_t send_room(const Peer& peer);
  /// Posts up to `credits` backlog chunks, across transfers, in one call;
  /// how many it tried (0: the backlog's head is a notification waiting
  /// for its window).
  std::uint32_t post_chain(Peer& peer, std::uint32_t credits);
  /// The work request for chunk `index` of `op` (an atomic takes a scratch
  /// slot for its old value, a notification a mailbox slot and a place in
  /// the peer's window).
  void prepare_work_request(Peer& peer, VerbsTransferOp& op, std::uint64_t index, ibv_send_wr& wr, ibv_sge& sge);
  void prepare_atomic(VerbsTransferOp& op, ibv_send_wr& wr, ibv_sge& sge);
  void prepare_notification(Peer& peer, VerbsTransferOp& op, ibv_send_wr& wr, ibv_sge& sge);  // notifications.cpp
  /// Gives back what preparing took from a work request the queue pair did not take.
  void unprepare(Peer& peer, VerbsTransferOp& op);
  /// Frees the atomic's scratch slot; the word the device left there.
  std::uint64_t release_scratch(VerbsTransferOp& op);
  /// Polls a completion queue dry through `handle`; the number of completions.
  std::size_t poll(ibv_cq* queue, void (Engine::*handle)(const ibv_wc&));
  /// A send-queue completion: a transfer's, an atomic's, a notification's
  /// or an acknowledgement's.
  void on_completion(const ibv_wc& wc);
  /// What every completion does for its peer: an error breaks it, a closed
  /// one goes once drained, freed room is refilled.
  void after_completion(const ibv_wc& wc, PeerId peer_id, Peer* peer, bool cause_follows);
  /// One of `op`'s work requests completed.
  void on_work_completed(VerbsTransferOp& op, const ibv_wc& wc, PeerId peer_id, Peer* peer);
  /// An atomic's work request succeeded, leaving the word's old value: true
  /// when the atomic is done, false when a swap whose compare-and-swap
  /// missed went back to the backlog to try again.
  bool atomic_applied(VerbsTransferOp& op, std::uint64_t old, PeerId peer_id, Peer* peer);
  /// Gives up a transfer's unposted chunks; finishes it if nothing is posted.
  void abandon_unposted(VerbsTransferOp& op, const Error& why);
  void finish_if_done(VerbsTransferOp& op);
  void finish_transfer(std::uint64_t id);
  /// A transfer or atomic of the peer's finished: its flushes count it
  /// (and inherit its failure), and those with nothing left finish.
  void count_for_flushes(const VerbsTransferOp& op);
  /// Answers the peer's waiting flushes with `why` (the peer broke).
  void fail_flushes(Peer& peer, const Error& why);

  // Notifications (progress thread, notifications.cpp).
  /// Posts a receive into receive slot `slot`; breaks the peer if it cannot.
  void post_receive(Peer& peer, std::uint32_t slot);
  /// A receive-queue completion: a notification, an acknowledgement, or
  /// something to drop.
  void on_receive(const ibv_wc& wc);
  /// What becomes of a notification from `peer`: queued, or why not.
  wire::NotifyStatus accept_notification(const Peer& peer, std::uint64_t tag);
  /// The target's answer to one of our notifications to `from`.
  void on_ack(PeerId from, const wire::AckMessage& ack);
  /// Posts due acknowledgements while there is room and a slot.
  void post_acks(Peer& peer);
  /// An acknowledgement's SEND completed.
  void on_ack_sent(Peer& peer, std::uint32_t slot);
  /// A notification's SEND completed well: now it waits for its
  /// acknowledgement, unless its peer broke or closed meanwhile.
  void notification_sent(VerbsTransferOp& op, const Peer* peer);
  /// A notification finished: its place in the window frees.
  void leave_window(const VerbsTransferOp& op);
  /// Fails the peer's notifications that wait for an acknowledgement.
  void fail_unacknowledged(Peer& peer, const Error& why);

  // Events (progress thread).
  void arm_async_watch();
  void drain_async_events();
  void consume_cq_events();

  const Config config;
  const std::shared_ptr<const IbvApi> api;
  OpenedDevice device;
  std::uint32_t max_message = 0;
  std::uint32_t rd_atomic = 1;
  bool atomics_supported = false;  // the device's atomic_cap is not IBV_ATOMIC_NONE
  OwnedPd pd;
  OwnedChannel channel;
  OwnedCq cq;  // send queues' completions
  /// Receive queues' completions: completion_queue_depth entries, so at
  /// most that many receives may be posted across peers (room_for_peer),
  /// and it never overruns, whatever the send side does.
  OwnedCq recv_cq;
  /// Where atomics' old values land: one word per completion-queue entry,
  /// so a slot is free whenever there is room to post (outstanding work
  /// never exceeds the CQ). Registered for local write only; not counted in
  /// live_registrations(). Declared after the PD and before the peers, so
  /// the MR goes after every queue pair and before the PD.
  std::vector<std::uint64_t> scratch;
  OwnedMr scratch_mr;
  std::vector<std::uint32_t> free_slots;
  std::optional<asio::posix::stream_descriptor> cq_wake;     // a dup of the channel's fd
  std::optional<asio::posix::stream_descriptor> async_wake;  // a dup of the context's async fd
  bool cq_wait_armed = false;
  bool async_wait_armed = false;

  std::map<PeerId, Peer> peers;
  std::map<std::uint32_t, PeerId> peer_by_qp_num;
  std::vector<PeerId> peers_to_pump;  // given transfers or room: pumped in progress()
  /// Closed peers kept receive-only, oldest first; beyond
  /// max_lingering_peers the oldest is broken and goes.
  std::deque<PeerId> lingering;
  bool completion_queue_full = false;  // a peer waits for room in the shared CQ
  std::uint32_t outstanding_total = 0;  // across queue pairs: bounded by the CQ
  std::mt19937 psn_source{std::random_device{}()};
};

}  // namespace corma::verbs
