// The UCX backend's engine: the provider half of a backend_kit::TransferEngine.
// Only the progress thread touches UCX handles; callers reach it through
// the core's submit().
#pragma once

#include "backend_kit/transfer_engine.hpp"

#include <corma/ucx.hpp>

#include <ucp/api/ucp.h>

#include <boost/asio/posix/stream_descriptor.hpp>

#include <cstdint>
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

struct UcxTransferOp : TransferOp {
  ucp_rkey_h rkey = nullptr;
  bool owns_rkey = false;  // false: the peer's key cache owns it
  bool uses_imported = false;  // counted among its imported key's users
  ucs_status_t status = UCS_OK;
  std::vector<std::uint64_t>* finished = nullptr;  // the engine's completion list
  /// Given up while UCX still holds its request: answered and no longer
  /// tracked, but its local region stays pinned (and its key alive) until
  /// UCX completes the request or the worker is destroyed.
  bool stranded = false;
};

struct Backend::Engine final : backend_kit::TransferEngine<UcxTransferOp> {
  /// A packed key that passed validation and was unpacked for one peer.
  struct CachedKey {
    ucp_rkey_h rkey = nullptr;
    std::uint64_t addr = 0;
    std::uint64_t len = 0;
  };
  /// A key imported for a peer: released ones stay until their last
  /// transfer ends (UCX may still read the rkey).
  struct ImportedKey {
    CachedKey key;
    std::size_t users = 0;  ///< transfers admitted with it and not yet ended
    bool released = false;
  };
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
    std::map<PackedKey, CachedKey> keys;
    std::map<RemoteKeyId, ImportedKey> imported;
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
  void on_transfer_deadline(UcxTransferOp& op) override;
  void run_import_key(const std::shared_ptr<ValueOp<RemoteKeyId>>& op) override;
  void run_release_key(const std::shared_ptr<VoidOp>& op, RemoteKeyId key) override;
  void run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op) override;
  void run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op) override;
  void run_peer_complete(const std::shared_ptr<ValueOp<void>>& op) override;
  void run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id) override;
  void close_peers() override;
  void forget_transfer(UcxTransferOp& op) override;
  void tear_down() override;
  std::size_t progress() override;
  bool arm_for_sleep() override;

  // Helpers (progress thread).
  /// Peers need RMA: untrusted tcp makes none.
  Result<void> peers_allowed() const;
  /// The transfer's rkey (imported, or cached per peer), its remote range
  /// checked.
  Result<ucp_rkey_h> remote_key(UcxTransferOp& op, Peer& peer);
  /// Validates a packed key and unpacks it for `peer`'s endpoint.
  Result<CachedKey> unpack_key(const PackedKey& packed, Peer& peer);
  /// A transfer that used an imported key ended: a released key goes once
  /// its last user did.
  void end_use_of(PeerId peer, RemoteKeyId key);
  void finish_transfer(std::uint64_t id, ucs_status_t status);
  void forget_keys(Peer& peer);
  /// Keeps a peer's keys until the worker goes: a pending request may use them.
  void retire_keys(Peer& peer);
  /// The initiator's endpoint to the target that answered.
  Result<ucp_ep_h> create_endpoint(const std::vector<std::byte>& answer);
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
  void drop_own_key(UcxTransferOp& op);
  void poll_closing();

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

  std::optional<asio::posix::stream_descriptor> wake;  // a dup of the worker's event fd
  bool wake_armed = false;

  /// An endpoint closed before its wire-up finished: the target's reply to
  /// it may still be on its way to our worker.
  bool replies_owed = false;

  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::uint64_t local_md_map = 0;
  std::vector<std::byte> own_address;

  std::map<PeerId, Peer> peers;
  std::vector<std::uint64_t> finished;  // filled by UCX callbacks, drained after progress
  std::vector<Closing> closing_endpoints;
  /// Transfers given up with their broken peer, by id. UCX may still hold
  /// their requests (and call back into them), so they live until it
  /// completes them or the worker dies.
  std::map<std::uint64_t, std::shared_ptr<UcxTransferOp>> orphans;
  /// Keys of stranded peers: a pending request may still use them, so they
  /// are destroyed only with the worker.
  std::vector<ucp_rkey_h> retired_keys;
};

}  // namespace corma::ucx
