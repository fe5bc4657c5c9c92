// The UCX backend's engine: the provider half of a backend_kit::TransferEngine.
// Only the progress thread touches UCX handles; callers reach it through
// the core's submit().
#pragma once

#include "backend_kit/transfer_engine.hpp"
#include "remote_key.hpp"
#include "worker.hpp"
#include "wire.hpp"

#include <corma/ucx.hpp>

#include <ucp/api/ucp.h>

#include <boost/asio/posix/stream_descriptor.hpp>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace corma::ucx {

namespace asio = boost::asio;
using backend_kit::MapOp;
using backend_kit::TransferOp;
using backend_kit::ValueOp;
using backend_kit::VoidOp;

/// `call` failed with `status`, answered as `code`.
[[nodiscard]] Error ucs_error(errc code, const char* call, ucs_status_t status);

struct UcxTransferOp : TransferOp {
  SharedRemoteKey key;  ///< held until UCX is done with the transfer
  ucs_status_t status = UCS_OK;
  std::uint64_t unread_reply = 0;  ///< where an `add`'s old value lands, unread
  /// A notification goes through these: its endpoint flush, then its active
  /// message, then the target's acknowledgement (which may come first).
  enum class Stage : std::uint8_t { none, flushing, sending, sent } stage = Stage::none;
  std::vector<std::byte> notify_header;
  std::optional<std::uint64_t> ack;  ///< the acknowledgement's status, once it came
  std::vector<std::uint64_t>* finished = nullptr;  // the engine's completion list
  /// A whole batch's: the keys its elements named beyond `key`, held until
  /// UCX is done with them, and the first failure posting its elements.
  std::vector<SharedRemoteKey> run_keys;
  ucs_status_t post_status = UCS_OK;
};

struct Backend::Engine final : backend_kit::TransferEngine<UcxTransferOp> {
  struct Peer {
    ucp_ep_h ep = nullptr;  ///< the initiator's endpoint, once its peer is complete
    bool broken = false;
    /// UCX itself reported the endpoint failed (its error callback).
    bool failed = false;
    /// A transfer reached UCX: the endpoint's wire-up has begun (UCX asks
    /// the target for its endpoint id with the first operation that needs it).
    bool wire_up_started = false;
    /// A transfer completed: the target's wire-up reply has arrived.
    bool wired = false;
    /// Accepted: the peer reads from us and connected itself; we hold no
    /// endpoint to it and transfer nothing towards it.
    bool reader = false;
    /// Keys are validated and unpacked once per peer, not per transfer.
    std::map<PackedKey, SharedRemoteKey> keys;
    /// Keys imported for this peer; a released one leaves the map and
    /// lives on in the transfers still using it.
    std::map<RemoteKeyId, SharedRemoteKey> imported;
    /// An initiator's: the token the target gave, carried by notifications.
    /// An accepted peer's: the token it was given.
    std::uint64_t notify_token = 0;
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

  // Engine hooks (progress thread).
  Result<Registration> provider_map(void* ptr, std::size_t len, Access access) override;
  Result<void> provider_unmap(void* handle) override;
  void run_transfer(const std::shared_ptr<UcxTransferOp>& op) override;
  void run_atomic(const std::shared_ptr<UcxTransferOp>& op) override;
  void run_flush(const std::shared_ptr<UcxTransferOp>& op) override;
  void run_notify(const std::shared_ptr<UcxTransferOp>& op) override;
  void on_transfer_deadline(UcxTransferOp& op) override;
  void run_import_key(const std::shared_ptr<ValueOp<RemoteKeyId>>& op) override;
  void run_release_key(const std::shared_ptr<VoidOp>& op, RemoteKeyId key) override;
  void run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op) override;
  void run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op) override;
  void run_peer_complete(const std::shared_ptr<ValueOp<void>>& op) override;
  void run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id) override;
  void close_peers() override;
  void forget_transfer(UcxTransferOp& op) override;
  [[nodiscard]] bool runs_whole_batches() const noexcept override { return true; }
  void run_whole_batch(const std::shared_ptr<UcxTransferOp>& op) override;
  void tear_down() override;
  std::size_t progress() override;
  bool arm_for_sleep() override;

  // Helpers (progress thread).
  /// Peers need RMA: untrusted tcp makes none.
  Result<void> peers_allowed() const;
  /// The transfer's key (imported, or cached per peer), its remote range
  /// and a put's access checked.
  Result<SharedRemoteKey> remote_key(const TransferRequest& request, bool is_put, Peer& peer);
  /// The key a transfer or atomic names: imported, or cached per peer.
  Result<SharedRemoteKey> find_key(const TransferKey& named, Peer& peer);
  /// The peer `op` goes to, if it may: not cancelled, open, a complete
  /// initiator endpoint, RMA enabled.
  Result<Peer*> initiator_peer(const UcxTransferOp& op);
  /// UCX request parameters that complete `op` through on_transfer_done.
  ucp_request_param_t callback_param(UcxTransferOp& op);
  /// What UCX answered issuing tracked `op`: finished now, or later.
  void issued(const UcxTransferOp& op, ucs_status_ptr_t handle);
  /// Validates a packed key and unpacks it for `peer`'s endpoint.
  Result<SharedRemoteKey> unpack_key(const PackedKey& packed, Peer& peer);
  void finish_transfer(std::uint64_t id, ucs_status_t status);
  /// UCX is done with `op`: its keys and local regions are let go.
  void release_holds(UcxTransferOp& op);

  // Whole batches (batch_run.cpp): every element of a batch to one peer is
  // admitted first, then posted in one loop with no callback, and one
  // endpoint flush behind them completes the batch.
  /// Where an admitted element goes; `local` is null for a refused one.
  struct AdmittedElement {
    std::byte* local = nullptr;
    ucp_rkey_h rkey = nullptr;
  };
  /// Admits every element of `op`'s run, refusing the bad ones by index;
  /// fills `admitted`. The run's keys are held by `op`.
  void admit_run(UcxTransferOp& op, Peer& peer);
  /// The run's admitted elements, posted: stops at the first UCX refuses.
  void post_run(UcxTransferOp& op, ucp_ep_h ep);
  /// What posting a transfer's blocks did: how many UCX took, and why it
  /// refused the next one (UCS_OK: it took them all).
  struct Posted {
    std::uint64_t blocks = 0;
    ucs_status_t status = UCS_OK;
  };
  /// Posts every block of `req` (one, or its strided blocks) with no
  /// callback, its first local byte at `local`; stops at the first refused.
  static Posted post_blocks(ucp_ep_h ep, bool put, const TransferRequest& req, std::byte* local, ucp_rkey_h rkey);
  /// Where each element of the run being admitted goes; kept between
  /// batches so that its capacity is reused.
  std::vector<AdmittedElement> admitted;
  /// Lets go of a peer's keys: those a transfer still uses go with it.
  static void forget_keys(Peer& peer);
  /// The initiator's endpoint to the target whose (decoded, padded) worker
  /// address this is.
  Result<ucp_ep_h> create_endpoint(const std::vector<std::byte>& address);
  void mark_broken(ucp_ep_h ep);
  /// Whether UCX can force an endpoint closed, failing what is in flight on
  /// it: only with peer error handling.
  [[nodiscard]] bool can_force_close() const noexcept;
  /// Marks a peer broken and ends its endpoint: force-closed where UCX can,
  /// its transfers stranded where it cannot.
  void abandon_endpoint(PeerId id, Peer& peer);
  /// The broken peer's endpoint is closed: whatever UCX did not finish on it
  /// never will; release the callers and the regions those transfers pinned.
  void orphan_transfers_of(PeerId peer);
  /// A peer whose transfers UCX cannot end: answers them now and keeps what
  /// they use (regions, keys, endpoint) until UCX lets go of them.
  void strand_transfers_of(PeerId id, Peer& peer);
  /// UCX completed a transfer that was already given up.
  void release_orphan(std::uint64_t id);

  // Puts (put_flush.cpp). A put completes locally before the target has
  // its bytes; an endpoint flush says they are there. One flush per peer
  // per progress turn completes every put issued to it in that turn (a
  // batch of puts is one turn's worth), instead of one flush per put.
  /// Issues `op`'s put; it is answered when its peer's next flush ends.
  void issue_put(const std::shared_ptr<UcxTransferOp>& op, ucp_ep_h ep, std::byte* local);
  /// Flushes every peer that had puts issued since the last flush. Runs at
  /// the start of each progress turn and before an endpoint is closed.
  void flush_puts();
  static void on_put_flush_done(void* request, ucs_status_t status, void* user_data);
  void poll_closing();

  // Notifications (notifications.cpp).
  /// Registers the active-message handlers on `worker` (with RMA: peers exist).
  Result<void> listen_for_notifications(ucp_worker_h worker);
  /// A notification's UCX step ended well: the next one starts; true once
  /// it is sent and acknowledged (then it is answered by the acknowledgement).
  bool notification_answered(UcxTransferOp& op);
  /// What the target's acknowledgement of `op` says.
  static Result<void> acknowledged(const UcxTransferOp& op);
  /// Handles what the active-message callbacks recorded during the worker's
  /// turn: queues notifications and acknowledges them, finishes sends.
  std::size_t handle_notification_messages();
  void send_ack(ucp_ep_h reply, const wire::NotifyAck& ack);
  static ucs_status_t on_notify_message(void* arg, const void* header, std::size_t header_length, void* data,
                                        std::size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_ack_message(void* arg, const void* header, std::size_t header_length, void* data,
                                     std::size_t length, const ucp_am_recv_param_t* param);

  // Shutdown (engine_shutdown.cpp).
  /// Closing `peer`'s endpoint: remembers whether the target may still owe
  /// it a wire-up reply (see settle_worker).
  void note_endpoint_closing(const Peer& peer);
  /// Before the worker goes, when `listen`: serves the peers that read from
  /// us, or may still send us a wire-up reply, until they fall quiet (UCX
  /// 1.13 aborts the process destroying a worker that still queues a reply);
  /// bounded by the shutdown timeout.
  void settle_worker(bool listen);

  static void on_transfer_done(void* request, ucs_status_t status, void* user_data);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  const Config config;
  const bool rma;


  /// An endpoint closed before its wire-up finished: the target's reply to
  /// it may still be on its way to our worker.
  bool replies_owed = false;

  ucp_context_h context = nullptr;
  /// Accepts peers: its address goes to initiators, their reads and
  /// notifications arrive here. Our own endpoints live on `connecting`,
  /// made on the first one (worker.hpp says why they are two).
  ProgressedWorker accepting;
  ProgressedWorker connecting;
  std::uint64_t local_md_map = 0;
  std::vector<std::byte> own_address;

  std::map<PeerId, Peer> peers;
  std::vector<std::uint64_t> finished;  // filled by UCX callbacks, drained after progress
  std::vector<Closing> closing_endpoints;
  /// Transfers given up with their broken peer, by id. UCX may still hold
  /// their requests (and call back into them), so they live until it
  /// completes them or the worker dies. Orphans lost their local region
  /// with their closed endpoint; stranded transfers (a peer UCX cannot end)
  /// still pin theirs, released when UCX completes them.
  std::map<std::uint64_t, std::shared_ptr<UcxTransferOp>> orphans;
  std::map<std::uint64_t, std::shared_ptr<UcxTransferOp>> stranded;
  /// Puts issued and not yet covered by a flush: their peer and transfer id.
  /// Kept between turns so that its capacity is reused.
  std::vector<std::pair<PeerId, std::uint64_t>> unflushed_puts;
  /// A flush in flight and the transfer ids of the puts it completes (the
  /// transfer table, the orphans or the stranded hold the ops themselves).
  struct PutFlush {
    Engine* engine = nullptr;
    std::vector<std::uint64_t> puts;
    bool done = false;
  };
  std::list<PutFlush> put_flushes;

  /// Notifications from peers, by the token each accepted peer was given.
  std::map<std::uint64_t, PeerId> notify_tokens;  ///< each from the kernel's random source
  struct ArrivedNotification {
    ucp_ep_h reply = nullptr;  ///< where the acknowledgement goes (UCX's endpoint to the sender)
    wire::NotifyHeader header;
  };
  std::vector<ArrivedNotification> arrived_notifications;  // recorded in the UCX callback
  std::vector<wire::NotifyAck> arrived_acks;                // likewise
  struct PendingAck {
    void* request = nullptr;
    std::vector<std::byte> bytes;
  };
  std::list<PendingAck> pending_acks;  // acknowledgements UCX has not finished sending
  /// The puts ended with `status`: recorded for progress() to finish.
  void record_puts(const std::vector<std::uint64_t>& ids, ucs_status_t status);
};

}  // namespace corma::ucx
