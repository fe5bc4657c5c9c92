#include "engine.hpp"

#include "completion_error.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>

namespace corma::verbs {
namespace {

using backend_kit::answer;
using backend_kit::TransferKind;

backend_kit::EngineSettings settings_of(const Config& c) {
  return {"verbs", c.progress, c.spin_time, c.command_queue_capacity, c.operation_timeout, c.shutdown_timeout};
}

Error call_failed(errc code, const char* call, int err) {
  return Error{code, std::string("verbs: ") + call + ": " + std::strerror(err)};
}

/// Watching a provider fd from the io_context: a non-blocking duplicate
/// (asio closes its copy; the provider keeps its own).
Result<asio::posix::stream_descriptor> watch_fd(asio::io_context& io, int fd, const char* what) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return call_failed(errc::not_configured, what, errno);
  }
  const int copy = ::dup(fd);
  if (copy < 0) return call_failed(errc::not_configured, what, errno);
  return asio::posix::stream_descriptor(io, copy);
}

constexpr int access_flags(Access access) {
  int flags = IBV_ACCESS_LOCAL_WRITE;  // the destination of a get
  if (access_allows(access, Access::remote_read)) flags |= IBV_ACCESS_REMOTE_READ;
  if (access_allows(access, Access::remote_read_write)) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access_allows(access, Access::remote_atomic)) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  return flags;
}

/// Verbs has fetch-and-add and compare-and-swap; `add` is a fetch-and-add
/// whose old value nobody reads, `swap` a compare-and-swap loop.
bool is_fetch_add(AtomicOp op) { return op == AtomicOp::add || op == AtomicOp::fetch_add; }

/// What a failed work request was doing, for its error's detail.
std::string describe_work(const VerbsTransferOp& op) {
  if (op.kind == TransferKind::notify) return "SEND (notification)";
  if (op.kind == TransferKind::atomic) {
    char where[32];
    std::snprintf(where, sizeof where, "0x%llx", static_cast<unsigned long long>(op.atomic.remote_addr));
    return std::string(is_fetch_add(op.atomic.op) ? "ATOMIC FETCH_AND_ADD" : "ATOMIC CMP_AND_SWP") + " on " + where;
  }
  return std::string(op.kind == TransferKind::put ? "RDMA WRITE" : "RDMA READ") + " of " +
         std::to_string(op.request.len) + " bytes";
}

/// A key a transfer or atomic names: imported for `imported`'s peer, or
/// packed in the request.
Result<wire::RemoteKey> key_named(const TransferKey& named, const std::map<RemoteKeyId, wire::RemoteKey>& imported) {
  if (const auto* id = std::get_if<RemoteKeyId>(&named)) {
    auto found = imported.find(*id);
    if (found == imported.end()) return fail(errc::invalid_key, "no key imported under that id for this peer");
    return found->second;
  }
  return wire::decode_key(std::get<PackedKey>(named));
}

constexpr std::uint32_t max_chain = 16;  // work requests per ibv_post_send call
constexpr int poll_batch = 32;
/// Closed peers kept receive-only, to refuse (and count) what they still
/// send; each keeps its receive queue, so the bound also bounds the receive
/// CQ room they hold.
constexpr std::size_t max_lingering_peers = 16;

}  // namespace

Backend::Engine::Engine(const Config& c, std::shared_ptr<const IbvApi> table)
    : TransferEngine(settings_of(c)), config(c), api(std::move(table)) {}

// ---- start / tear down ----

Result<void> Backend::Engine::start() {
  if (const char* missing = first_missing_entry(*api)) {
    return fail(errc::not_configured, std::string("verbs: the function table lacks ") + missing);
  }
  use_status_text(*api);
  CORMA_TRY(device, open_device(*api, config));
  max_message = device.port_attr.max_msg_sz;
  const int device_rd = device.device_attr.max_qp_rd_atom > 0 ? device.device_attr.max_qp_rd_atom : 1;
  rd_atomic = config.max_rd_atomic != 0 ? config.max_rd_atomic : static_cast<std::uint32_t>(std::min(device_rd, 16));
  atomics_supported = device.device_attr.atomic_cap != IBV_ATOMIC_NONE;
  auto started = [&]() -> Result<void> {
    ibv_context* context = device.context.get();
    pd = own<OwnedPd>(*api, api->alloc_pd(context));
    if (pd == nullptr) return call_failed(errc::not_configured, "ibv_alloc_pd", errno);
    channel = own<OwnedChannel>(*api, api->create_comp_channel(context));
    if (channel == nullptr) return call_failed(errc::not_configured, "ibv_create_comp_channel", errno);
    const auto cq_depth = static_cast<int>(config.completion_queue_depth);
    cq = own<OwnedCq>(*api, api->create_cq(context, cq_depth, nullptr, channel.get(), 0));
    if (cq == nullptr) return call_failed(errc::not_configured, "ibv_create_cq", errno);
    recv_cq = own<OwnedCq>(*api, api->create_cq(context, cq_depth, nullptr, channel.get(), 0));
    if (recv_cq == nullptr) return call_failed(errc::not_configured, "ibv_create_cq (receives)", errno);
    if (atomics_supported) {
      CORMA_TRY(register_scratch());
    }
    CORMA_TRY(cq_wake, watch_fd(io, channel->fd, "completion channel fd"));
    CORMA_TRY(async_wake, watch_fd(io, device.context->async_fd, "async event fd"));
    return success();
  }();
  if (!started) {
    tear_down();
    return started;
  }
  arm_async_watch();
  return success();
}

void Backend::Engine::tear_down() {
  stop_deadline_sweep();
  while (!peers.empty()) destroy_peer(peers.begin());
  boost::system::error_code ignored;
  if (cq_wake) cq_wake->close(ignored);
  if (async_wake) async_wake->close(ignored);
  cq_wake.reset();
  async_wake.reset();
  consume_cq_events();  // every event acknowledged, or destroying a CQ blocks
  cq.reset();
  recv_cq.reset();
  channel.reset();
  scratch_mr.reset();  // after every queue pair that could write into it
  pd.reset();
  device.context.reset();
  mark_torn_down();
}

Error Backend::Engine::no_atomics() const {
  return Error{errc::not_configured, "verbs: " + device.name + " has no atomics (atomic_cap is IBV_ATOMIC_NONE)"};
}

Result<void> Backend::Engine::register_scratch() {
  scratch.assign(config.completion_queue_depth, 0);
  errno = 0;
  scratch_mr = own<OwnedMr>(*api, api->reg_mr(pd.get(), scratch.data(), scratch.size() * sizeof(std::uint64_t),
                                              IBV_ACCESS_LOCAL_WRITE));
  if (scratch_mr == nullptr) {
    return call_failed(errc::not_configured, "ibv_reg_mr (atomic scratch area)", errno != 0 ? errno : EINVAL);
  }
  free_slots.resize(scratch.size());
  std::iota(free_slots.rbegin(), free_slots.rend(), std::uint32_t{0});  // slot 0 is taken first
  return success();
}

// ---- registration ----

Result<backend_kit::EngineCore::Registration> Backend::Engine::provider_map(void* ptr, std::size_t len,
                                                                          Access access) {
  // Refused here rather than by a peer's NIC later: the key would promise
  // atomics this device cannot serve.
  if (access_allows(access, Access::remote_atomic) && !atomics_supported) return no_atomics();
  const int flags = access_flags(access);
  errno = 0;
  ibv_mr* mr = nullptr;
  if (config.relaxed_ordering && api->reg_mr_iova2 != nullptr) {
    mr = api->reg_mr_iova2(pd.get(), ptr, len, reinterpret_cast<std::uint64_t>(ptr),
                           static_cast<unsigned>(flags | IBV_ACCESS_RELAXED_ORDERING));
  } else {
    mr = api->reg_mr(pd.get(), ptr, len, flags);
  }
  if (mr == nullptr) return call_failed(errc::backend, "ibv_reg_mr", errno != 0 ? errno : EINVAL);
  // The NIC pins whole pages: report the page-enclosing range.
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<std::uint64_t>(ptr) / page * page;
  const auto end = (reinterpret_cast<std::uint64_t>(ptr) + len + page - 1) / page * page;
  PackedKey key;
  if (access != Access::local) {
    key = wire::encode_key({mr->rkey, reinterpret_cast<std::uint64_t>(ptr), len, access});
  }
  return Registration{mr, first, end - first, std::move(key)};
}

Result<void> Backend::Engine::provider_unmap(void* handle) {
  if (int rc = api->dereg_mr(static_cast<ibv_mr*>(handle)); rc != 0) {
    return call_failed(errc::backend, "ibv_dereg_mr", rc);
  }
  return success();
}

// ---- queue pairs ----

Result<OwnedQp> Backend::Engine::create_qp() {
  ibv_qp_init_attr init{};
  init.send_cq = cq.get();
  init.recv_cq = recv_cq.get();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = config.send_queue_depth;
  init.cap.max_recv_wr = Mailbox::receive_depth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  errno = 0;
  auto qp = own<OwnedQp>(*api, api->create_qp(pd.get(), &init));
  if (qp == nullptr) return call_failed(errc::backend, "ibv_create_qp", errno != 0 ? errno : EINVAL);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = config.port;
  // The queue pair admits remote reads, writes and (where the device has
  // them) atomics; each region's own access flags decide what a peer may
  // really do.
  attr.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  if (atomics_supported) attr.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
  if (int rc = api->modify_qp(qp.get(), &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    return call_failed(errc::backend, "ibv_modify_qp(INIT)", rc);
  }
  return qp;
}

Result<void> Backend::Engine::connect_qp(ibv_qp* qp, const wire::QpEndpoint& local, const wire::QpEndpoint& remote) {
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = to_ibv_mtu(std::min(local.mtu, remote.mtu));
  rtr.dest_qp_num = remote.qp_num;
  rtr.rq_psn = remote.psn;
  rtr.max_dest_rd_atomic = static_cast<std::uint8_t>(rd_atomic);
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.port_num = config.port;
  rtr.ah_attr.dlid = remote.lid;
  if (remote.has_gid && device.gid_index >= 0) {
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
    rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(device.gid_index);
    rtr.ah_attr.grh.hop_limit = 64;
  }
  if (int rc = api->modify_qp(qp, &rtr,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return call_failed(errc::peer_unreachable, "ibv_modify_qp(RTR)", rc);
  }
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = config.timeout;
  rts.retry_cnt = config.retry_count;
  rts.rnr_retry = config.rnr_retry;
  rts.sq_psn = local.psn;
  rts.max_rd_atomic = static_cast<std::uint8_t>(rd_atomic);
  if (int rc = api->modify_qp(qp, &rts,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return call_failed(errc::peer_unreachable, "ibv_modify_qp(RTS)", rc);
  }
  return success();
}

Result<void> Backend::Engine::room_for_peer() const {
  // Every peer, lingering closed ones included, keeps its whole receive
  // queue posted; the receive CQ holds all of them.
  if ((peers.size() + 1) * Mailbox::receive_depth > config.completion_queue_depth) {
    return fail(errc::budget_exceeded,
                "verbs: the receive completion queue has no room for another peer's " +
                    std::to_string(Mailbox::receive_depth) + " receives (completion_queue_depth " +
                    std::to_string(config.completion_queue_depth) + ")");
  }
  return success();
}

Result<PeerId> Backend::Engine::add_peer(OwnedQp qp, const wire::QpEndpoint& local) {
  CORMA_TRY(auto mailbox, Mailbox::create(*api, pd.get()));
  const PeerId id{new_id()};
  peer_by_qp_num.emplace(qp->qp_num, id);
  Peer fresh;
  fresh.id = id;
  fresh.mailbox = std::move(mailbox);
  fresh.qp = std::move(qp);
  fresh.local = local;
  auto& peer = peers.emplace(id, std::move(fresh)).first->second;
  // Posted in INIT, before the other side can reach the queue pair: its
  // first SEND finds a receive.
  for (std::uint32_t slot = 0; slot < Mailbox::receive_depth && !peer.broken; ++slot) post_receive(peer, slot);
  if (peer.broken) {
    destroy_peer(peers.find(id));
    return fail(errc::backend, "verbs: ibv_post_recv refused a new queue pair's receives");
  }
  return id;
}

void Backend::Engine::destroy_peer(std::map<PeerId, Peer>::iterator it) {
  if (it->second.qp != nullptr) peer_by_qp_num.erase(it->second.qp->qp_num);
  auto waiter = std::move(it->second.close_waiter);
  peers.erase(it);
  if (waiter) answer(*waiter, success());
}

void Backend::Engine::break_peer(Peer& peer, const Error& why) {
  if (!peer.broken && peer.qp != nullptr) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    (void)api->modify_qp(peer.qp.get(), &attr, IBV_QP_STATE);  // already there when the NIC put it there
  }
  peer.broken = true;
  // Their receives flush with the queue pair: no credit is returned.
  peer.acks_due.clear();
  stop_sending(peer, why);
}

void Backend::Engine::stop_sending(Peer& peer, const Error& why) {
  auto backlog = std::move(peer.backlog);
  peer.backlog.clear();
  for (auto& op : backlog) abandon_unposted(*op, why);
  // Posted work still completes (or flushes), but what it did is now
  // unknowable: the flushes waiting for it are answered now, like the
  // backlog, and so are notifications whose acknowledgement may not come.
  fail_flushes(peer, why);
  fail_unacknowledged(peer, why);
}

bool Backend::Engine::linger(Peer& peer, const Error& why) {
  // A transfer still posted can only be ended by the error state.
  if (!peer.connected || peer.broken || peer.outstanding != peer.acks_in_flight) return false;
  // No remote access any more: a closed peer's reads and writes fail (and
  // break the connection); only its SENDs are still taken, to be refused.
  ibv_qp_attr attr{};
  attr.qp_access_flags = 0;
  if (api->modify_qp(peer.qp.get(), &attr, IBV_QP_ACCESS_FLAGS) != 0) return false;
  stop_sending(peer, why);
  lingering.push_back(peer.id);
  while (lingering.size() > max_lingering_peers) {
    auto oldest = peers.find(lingering.front());
    lingering.pop_front();
    if (oldest == peers.end() || oldest->second.broken) continue;  // gone already
    break_peer(oldest->second, Error{errc::peer_unreachable, "verbs: closed peer no longer kept"});
    if (drained(oldest->second)) destroy_peer(oldest);
  }
  return true;
}

namespace {

wire::QpEndpoint describe(const OpenedDevice& device, const ibv_qp& qp, std::uint32_t psn, std::uint16_t mtu) {
  wire::QpEndpoint local;
  local.qp_num = qp.qp_num;
  local.psn = psn;
  local.lid = device.port_attr.lid;
  local.has_gid = device.gid_index >= 0;
  if (local.has_gid) std::memcpy(local.gid.data(), device.gid.raw, local.gid.size());
  local.mtu = mtu;
  return local;
}

}  // namespace

void Backend::Engine::run_import_key(const std::shared_ptr<ValueOp<RemoteKeyId>>& op) {
  auto known = peers.find(op->peer);
  const std::size_t imported = known == peers.end() ? 0 : known->second.imported.size();
  if (auto room = check_import(op->blob, imported); !room) return op->completion.dispatch(std::move(room).error());
  if (auto peer = usable_peer(op->peer); !peer) return op->completion.dispatch(std::move(peer).error());
  auto key = wire::decode_key(op->blob);
  if (!key) return op->completion.dispatch(std::move(key).error());
  const RemoteKeyId id{new_id()};
  known->second.imported.emplace(id, key.value());
  op->completion.dispatch(id);
}

void Backend::Engine::run_release_key(const std::shared_ptr<VoidOp>& op, RemoteKeyId key) {
  if (closed()) return answer(*op, shut_down_error());
  for (auto& [id, peer] : peers) {
    if (peer.imported.erase(key) != 0) break;
  }
  answer(*op, success());  // idempotent
}

void Backend::Engine::run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op) {
  if (closed()) return op->completion.dispatch(shut_down_error());
  if (auto room = room_for_peer(); !room) return op->completion.dispatch(std::move(room).error());
  auto qp = create_qp();
  if (!qp) return op->completion.dispatch(std::move(qp).error());
  const auto local = describe(device, *qp.value().get(), psn_source() & 0xffffffU, path_mtu_bytes(config, device.port_attr));
  auto id = add_peer(std::move(qp).value(), local);
  if (!id) return op->completion.dispatch(std::move(id).error());
  op->completion.dispatch(PeerOffer{id.value(), wire::encode_endpoint(local)});
}

void Backend::Engine::run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op) {
  if (closed()) return op->completion.dispatch(shut_down_error());
  auto remote = wire::decode_endpoint(op->blob);
  if (!remote) return op->completion.dispatch(std::move(remote).error());
  if (auto room = room_for_peer(); !room) return op->completion.dispatch(std::move(room).error());
  auto qp = create_qp();
  if (!qp) return op->completion.dispatch(std::move(qp).error());
  const auto local = describe(device, *qp.value().get(), psn_source() & 0xffffffU, path_mtu_bytes(config, device.port_attr));
  // The receives go in before the queue pair can receive.
  auto id = add_peer(std::move(qp).value(), local);
  if (!id) return op->completion.dispatch(std::move(id).error());
  auto& peer = peers.at(id.value());
  if (auto connected = connect_qp(peer.qp.get(), local, remote.value()); !connected) {
    peer.closed = true;  // goes once its receives have flushed
    break_peer(peer, connected.error());
    if (drained(peer)) destroy_peer(peers.find(id.value()));
    return op->completion.dispatch(std::move(connected).error());
  }
  peer.connected = true;
  op->completion.dispatch(PeerAnswer{id.value(), wire::encode_endpoint(local)});
}

void Backend::Engine::run_peer_complete(const std::shared_ptr<ValueOp<void>>& op) {
  if (closed()) return op->completion.dispatch(shut_down_error());
  auto it = peers.find(op->peer);
  if (it == peers.end()) return op->completion.dispatch(fail(errc::peer_unreachable, "no pending peer with that id"));
  auto& peer = it->second;
  if (peer.closed) return op->completion.dispatch(fail(errc::peer_unreachable, "no pending peer with that id"));
  if (peer.connected || peer.broken) return op->completion.dispatch(fail(errc::protocol, "peer is already connected"));
  auto remote = wire::decode_endpoint(op->blob);
  if (!remote) return op->completion.dispatch(std::move(remote).error());
  if (auto connected = connect_qp(peer.qp.get(), peer.local, remote.value()); !connected) {
    return op->completion.dispatch(std::move(connected).error());
  }
  peer.connected = true;
  op->completion.dispatch(success());
}

void Backend::Engine::run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id) {
  if (closed()) return answer(*op, shut_down_error());
  auto it = peers.find(id);
  if (it == peers.end()) return answer(*op, success());  // idempotent
  auto& peer = it->second;
  if (peer.closed) return answer(*op, success());  // already closed or closing
  peer.closed = true;
  const Error why{errc::peer_unreachable, "verbs: peer closed"};
  if (linger(peer, why)) return answer(*op, success());
  break_peer(peer, why);
  // Posted work (receives too) flushes before the queue pair may go.
  peer.close_waiter = op;
  if (drained(peer)) destroy_peer(it);
}

// ---- transfers ----

Result<const Backend::Engine::Peer*> Backend::Engine::usable_peer(PeerId id) const {
  auto peer = peers.find(id);
  if (peer == peers.end() || peer->second.closed) return fail(errc::peer_unreachable, "unknown peer");
  if (peer->second.broken) return fail(errc::peer_unreachable, "peer is broken");
  if (!peer->second.connected) return fail(errc::peer_unreachable, "peer set-up is not complete");
  return &peer->second;
}

Result<void> Backend::Engine::admit_remote(VerbsTransferOp& op) const {
  const auto& req = op.request;
  CORMA_TRY(auto peer, usable_peer(req.peer));
  CORMA_TRY(auto key, key_named(req.key, peer->imported));
  // A put through a read-only key would fail on the wire and take the
  // queue pair down with it: refused here instead.
  CORMA_TRY(validate_remote_range(op.kind == backend_kit::TransferKind::put, req, key.addr, key.len, key.access));
  op.rkey = key.rkey;
  return success();
}

Result<void> Backend::Engine::still_wanted(const VerbsTransferOp& op) const {
  if (op.cancelled.load(std::memory_order_acquire)) {
    return fail(errc::cancelled, std::string(backend_kit::kind_name(op.kind)) + " cancelled before it ran");
  }
  if (closed()) return shut_down_error();
  return success();
}

Result<void> Backend::Engine::admit_atomic(VerbsTransferOp& op) const {
  CORMA_TRY(still_wanted(op));
  if (!atomics_supported) return no_atomics();
  const auto& req = op.atomic;
  CORMA_TRY(auto peer, usable_peer(req.peer));
  CORMA_TRY(auto key, key_named(req.key, peer->imported));
  CORMA_TRY(validate_atomic_word(req.remote_addr, key.addr, key.len, key.access));
  op.rkey = key.rkey;
  // A swap's first compare-and-swap guesses 0; each miss returns the value
  // to guess next.
  op.compare = req.op == AtomicOp::compare_swap ? req.compare : 0;
  op.plan = ChunkPlan(atomic_word_size, max_message);
  return success();
}

void Backend::Engine::run_transfer(const std::shared_ptr<VerbsTransferOp>& op) {
  if (op->cancelled.load(std::memory_order_acquire)) {
    return answer(*op, fail(errc::cancelled, "transfer cancelled before it ran"));
  }
  auto region = admit_local(op->request);
  if (!region) return answer(*op, std::move(region).error());
  if (auto remote = admit_remote(*op); !remote) return answer(*op, std::move(remote).error());
  op->lkey = static_cast<ibv_mr*>(region.value()->handle)->lkey;
  op->local = region.value()->addr + op->request.local_offset;
  op->plan = ChunkPlan(op->request.len, max_message, op->request.blocks);
  track(op, *region.value());
  enqueue(op);
}

void Backend::Engine::run_atomic(const std::shared_ptr<VerbsTransferOp>& op) {
  if (auto admitted = admit_atomic(*op); !admitted) return answer(*op, std::move(admitted).error());
  track(op);
  enqueue(op);
}

void Backend::Engine::run_flush(const std::shared_ptr<VerbsTransferOp>& op) {
  if (auto wanted = still_wanted(*op); !wanted) return answer(*op, std::move(wanted).error());
  if (auto usable = usable_peer(op->request.peer); !usable) return answer(*op, std::move(usable).error());
  auto& peer = peers.at(op->request.peer);
  // RC completes a queue pair's work in order, and a write's completion
  // means its bytes are placed at the target: once everything admitted
  // before the flush (posted or still in the backlog) has finished, the
  // puts among it are at the target.
  if (peer.unfinished == 0) return answer(*op, success());
  track(op);
  peer.flushes.push_back({op->id, peer.admitted, peer.unfinished});
}

void Backend::Engine::enqueue(const std::shared_ptr<VerbsTransferOp>& op) {
  auto& peer = peers.at(op->request.peer);
  op->admission = ++peer.admitted;
  ++peer.unfinished;
  push_backlog(op, peer);
}

void Backend::Engine::push_backlog(const std::shared_ptr<VerbsTransferOp>& op, Peer& peer) {
  // Posted at the turn's progress(), chained with the rest of this turn's
  // work to the peer (a batch's elements go in as few posts as the queues
  // allow).
  peer.backlog.push_back(op);
  schedule_pump(op->request.peer, peer);
}

void Backend::Engine::schedule_pump(PeerId id, Peer& peer) {
  if (peer.pump_due) return;
  peer.pump_due = true;
  peers_to_pump.push_back(id);
}

void Backend::Engine::pump_pending() {
  auto pending = std::move(peers_to_pump);
  peers_to_pump.clear();
  for (auto id : pending) {
    auto peer = peers.find(id);
    if (peer == peers.end()) continue;
    peer->second.pump_due = false;
    pump(peer->second);
  }
}

void Backend::Engine::pump(Peer& peer) {
  post_acks(peer);
  while (!peer.backlog.empty() && !peer.broken) {
    const std::uint32_t credits = std::min(send_room(peer), max_chain);
    // Completions free room: this peer's own, or (for a full completion
    // queue) any peer's, which then pumps every waiting peer. A
    // notification waiting for its window is pumped by the acknowledgement
    // that opens it.
    if (credits == 0 || post_chain(peer, credits) == 0) return;
    while (!peer.backlog.empty() && peer.backlog.front()->posted == peer.backlog.front()->plan.count()) {
      peer.backlog.pop_front();
    }
  }
}

std::uint32_t Backend::Engine::send_room(const Peer& peer) {
  const std::uint32_t queue_room = config.send_queue_depth - peer.outstanding;
  const std::uint32_t cq_room = config.completion_queue_depth - outstanding_total;
  if (cq_room == 0) completion_queue_full = true;
  return std::min(queue_room, cq_room);
}

std::uint32_t Backend::Engine::post_chain(Peer& peer, std::uint32_t credits) {
  std::array<ibv_send_wr, max_chain> wrs{};
  std::array<ibv_sge, max_chain> sges{};
  std::array<VerbsTransferOp*, max_chain> owners{};
  std::uint32_t n = 0;
  // The backlog's unposted chunks in order, across transfers: only the last
  // transfer in the chain may be cut short. A notification goes only into
  // room in the peer's window, and what follows it waits behind it.
  for (auto it = peer.backlog.begin(); it != peer.backlog.end() && n < credits; ++it) {
    VerbsTransferOp& op = **it;
    if (op.kind == TransferKind::notify && peer.notifications_in_flight == Mailbox::window) break;
    const auto take = static_cast<std::uint32_t>(std::min<std::uint64_t>(credits - n, op.plan.count() - op.posted));
    for (std::uint32_t i = 0; i < take; ++i, ++n) {
      prepare_work_request(peer, op, op.posted + i, wrs[n], sges[n]);
      owners[n] = &op;
    }
  }
  if (n == 0) return 0;
  for (std::uint32_t i = 0; i + 1 < n; ++i) wrs[i].next = &wrs[i + 1];
  ibv_send_wr* bad = nullptr;
  const int rc = api->post_send(peer.qp.get(), wrs.data(), &bad);
  const std::uint32_t accepted = rc == 0 ? n : static_cast<std::uint32_t>(bad - wrs.data());
  for (std::uint32_t i = 0; i < accepted; ++i) ++owners[i]->posted;
  // Work requests the queue pair did not take hold nothing: they take it
  // again when they are posted.
  for (std::uint32_t i = accepted; i < n; ++i) unprepare(peer, *owners[i]);
  peer.outstanding += accepted;
  outstanding_total += accepted;
  // The transfer whose chunk was refused gives up the rest; those behind it
  // in the chain posted nothing and stay in the backlog.
  if (rc != 0) abandon_unposted(*owners[accepted], call_failed(errc::backend, "ibv_post_send", rc));
  return n;
}

void Backend::Engine::unprepare(Peer& peer, VerbsTransferOp& op) {
  (void)release_scratch(op);
  if (op.send_slot != VerbsTransferOp::no_slot) {
    peer.mailbox.give_back(std::exchange(op.send_slot, VerbsTransferOp::no_slot));
  }
  if (op.in_window) {
    op.in_window = false;
    --peer.notifications_in_flight;
  }
}

void Backend::Engine::prepare_work_request(Peer& peer, VerbsTransferOp& op, std::uint64_t index, ibv_send_wr& wr,
                                           ibv_sge& sge) {
  wr.wr_id = op.id;
  wr.sg_list = &sge;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (op.kind == TransferKind::notify) return prepare_notification(peer, op, wr, sge);
  if (op.kind == TransferKind::atomic) return prepare_atomic(op, wr, sge);
  const Chunk chunk = op.plan[index];
  std::byte* local = op.local + chunk.block * op.request.local_stride + chunk.offset;
  sge = ibv_sge{reinterpret_cast<std::uint64_t>(local), chunk.len, op.lkey};
  wr.num_sge = chunk.len == 0 ? 0 : 1;
  wr.opcode = op.kind == TransferKind::put ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
  wr.wr.rdma.remote_addr = op.request.remote_addr_of(chunk.block) + chunk.offset;
  wr.wr.rdma.rkey = op.rkey;
}

void Backend::Engine::prepare_atomic(VerbsTransferOp& op, ibv_send_wr& wr, ibv_sge& sge) {
  // Never empty here: there are as many slots as CQ entries, a slot is held
  // only by a posted atomic, and a work request is posted only into CQ room
  // (see `scratch`).
  op.scratch_slot = free_slots.back();
  free_slots.pop_back();
  sge = ibv_sge{reinterpret_cast<std::uint64_t>(&scratch[op.scratch_slot]), atomic_word_size, scratch_mr->lkey};
  wr.num_sge = 1;
  const bool fetch_add = is_fetch_add(op.atomic.op);
  wr.opcode = fetch_add ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_ATOMIC_CMP_AND_SWP;
  wr.wr.atomic.remote_addr = op.atomic.remote_addr;
  wr.wr.atomic.compare_add = fetch_add ? op.atomic.operand : op.compare;
  wr.wr.atomic.swap = fetch_add ? 0 : op.atomic.operand;
  wr.wr.atomic.rkey = op.rkey;
}

std::uint64_t Backend::Engine::release_scratch(VerbsTransferOp& op) {
  if (op.scratch_slot == VerbsTransferOp::no_slot) return 0;
  const std::uint64_t word = scratch[op.scratch_slot];
  free_slots.push_back(op.scratch_slot);
  op.scratch_slot = VerbsTransferOp::no_slot;
  return word;
}

void Backend::Engine::abandon_unposted(VerbsTransferOp& op, const Error& why) {
  if (!op.failure) op.failure = why;
  op.completed += op.plan.count() - op.posted;
  op.posted = op.plan.count();
  finish_if_done(op);
}

void Backend::Engine::finish_if_done(VerbsTransferOp& op) {
  if (op.completed != op.plan.count()) return;
  // A posted notification is done once acknowledged too, unless it already
  // failed (then no acknowledgement is coming, or none that matters).
  if (op.in_window && !op.acknowledged && !op.failure) return;
  finish_transfer(op.id);
}

void Backend::Engine::on_completion(const ibv_wc& wc) {
  --outstanding_total;
  const auto known = peer_by_qp_num.find(wc.qp_num);
  const PeerId peer_id = known != peer_by_qp_num.end() ? known->second : PeerId{};
  Peer* peer = known != peer_by_qp_num.end() ? &peers.at(peer_id) : nullptr;
  if (peer != nullptr) --peer->outstanding;

  if (is_slot_wr(wc.wr_id)) {
    if (peer != nullptr) on_ack_sent(*peer, slot_of(wc.wr_id));
  } else if (auto* found = find_transfer(wc.wr_id)) {
    on_work_completed(*found, wc, peer_id, peer);
  }
  if (completion_queue_full) {
    completion_queue_full = false;
    for (auto& [id, waiting] : peers) {
      if (!waiting.backlog.empty() || !waiting.acks_due.empty()) schedule_pump(id, waiting);
    }
  }
  after_completion(wc, peer_id, peer, /*cause_follows=*/false);
}

void Backend::Engine::after_completion(const ibv_wc& wc, PeerId peer_id, Peer* peer, bool cause_follows) {
  if (peer == nullptr) return;
  // A failed completion puts an RC queue pair in the error state: the peer
  // is broken, the rest of its work flushes. Unless its cause is still to
  // come on the send queue: then the peer breaks with that cause.
  if (wc.status != IBV_WC_SUCCESS && !peer->broken && !cause_follows) {
    break_peer(*peer, Error{errc::peer_unreachable, "verbs: the queue pair entered the error state"});
  }
  if (peer->closed && drained(*peer)) return destroy_peer(peers.find(peer_id));
  // Refilled once the polled batch is handled: the freed slots go in one chain.
  if (!peer->backlog.empty() || !peer->acks_due.empty()) schedule_pump(peer_id, *peer);
}

void Backend::Engine::on_work_completed(VerbsTransferOp& op, const ibv_wc& wc, PeerId peer_id, Peer* peer) {
  ++op.completed;
  const std::uint64_t old = release_scratch(op);
  if (op.send_slot != VerbsTransferOp::no_slot && peer != nullptr) {
    peer->mailbox.give_back(std::exchange(op.send_slot, VerbsTransferOp::no_slot));
  }
  if (wc.status == IBV_WC_WR_FLUSH_ERR) {
    if (!op.failure) {
      op.failure = closing() ? shut_down_error()
                             : Error{errc::peer_unreachable, "verbs: flushed: the queue pair is in the error state"};
    }
  } else if (wc.status != IBV_WC_SUCCESS) {
    if (!op.failure) op.failure = completion_error(wc, describe_work(op));
  } else if (op.kind == TransferKind::atomic && !atomic_applied(op, old, peer_id, peer)) {
    return;
  } else if (op.kind == TransferKind::notify) {
    notification_sent(op, peer);
  }
  finish_if_done(op);
}

bool Backend::Engine::atomic_applied(VerbsTransferOp& op, std::uint64_t old, PeerId peer_id, Peer* peer) {
  const bool missed = op.atomic.op == AtomicOp::swap && old != op.compare;
  if (!missed) {
    if (op.atomic.op != AtomicOp::add) op.fetched = old;  // `add` answers 0
    return true;
  }
  // The word changed under the swap's guess: nothing was stored, so a
  // caller who stopped waiting (cancelled, timed out) needs no further try,
  // and a broken peer can take none.
  if (op.answered) return true;
  if (peer == nullptr || peer->broken) {
    if (!op.failure) op.failure = Error{errc::peer_unreachable, "verbs: peer broke while a swap was retrying"};
    return true;
  }
  // The next compare-and-swap expects what the miss returned: the swap ends
  // with the one that matched, atomically replacing the value it answers,
  // so it is linearizable. Each try is a work request of its own, queued
  // behind the peer's backlog like any other.
  op.compare = old;
  op.posted = 0;
  op.completed = 0;
  peer->backlog.push_back(share_transfer(op.id));
  schedule_pump(peer_id, *peer);
  return false;
}

void Backend::Engine::finish_transfer(std::uint64_t id) {
  auto taken = untrack(id);
  if (!taken) return;
  auto& op = *taken;
  // The caller hears of its transfer before an unmap that waited for it.
  if (op.failure) {
    answer(op, *op.failure);
  } else {
    answer(op, success());
  }
  unpin(op.request.local);
  if (op.admission != 0) count_for_flushes(op);
  if (op.in_window) leave_window(op);
}

void Backend::Engine::count_for_flushes(const VerbsTransferOp& op) {
  auto it = peers.find(op.request.peer);
  if (it == peers.end()) return;
  auto& peer = it->second;
  --peer.unfinished;
  for (auto& flush : peer.flushes) {
    if (flush.last < op.admission) continue;  // admitted after op
    --flush.remaining;
    auto* waiting = op.failure ? find_transfer(flush.id) : nullptr;
    if (waiting != nullptr && !waiting->failure) {
      // A flush vouches for every earlier put: it cannot once one failed.
      waiting->failure = *op.failure;
      waiting->failure->detail = "verbs: flush: an earlier " + std::string(backend_kit::kind_name(op.kind)) +
                                 " to this peer failed: " + op.failure->detail;
    }
  }
  while (!peer.flushes.empty() && peer.flushes.front().remaining == 0) {
    const auto done = peer.flushes.front().id;
    peer.flushes.pop_front();
    finish_transfer(done);
  }
}

void Backend::Engine::fail_flushes(Peer& peer, const Error& why) {
  auto flushes = std::move(peer.flushes);
  peer.flushes.clear();
  for (const auto& flush : flushes) {
    if (auto* waiting = find_transfer(flush.id); waiting != nullptr && !waiting->failure) waiting->failure = why;
    finish_transfer(flush.id);
  }
}

void Backend::Engine::on_transfer_deadline(VerbsTransferOp& op) {
  auto peer = peers.find(op.request.peer);
  if (peer != peers.end()) {
    break_peer(peer->second, Error{errc::timeout, "verbs: a transfer to this peer passed its deadline"});
  }
}

// ---- progress and events ----

std::size_t Backend::Engine::progress() {
  if (torn_down()) return 0;
  pump_pending();  // this turn's new transfers
  std::size_t events = poll(cq.get(), &Engine::on_completion);
  events += poll(recv_cq.get(), &Engine::on_receive);  // notifications, and acknowledgements
  pump_pending();  // the room their completions freed, the acknowledgements due
  return events;
}

std::size_t Backend::Engine::poll(ibv_cq* queue, void (Engine::*handle)(const ibv_wc&)) {
  std::array<ibv_wc, poll_batch> wcs{};
  std::size_t events = 0;
  for (;;) {
    const int n = api->poll_cq(queue, poll_batch, wcs.data());
    if (n < 0) {
      // The completion queue itself failed (an overrun): nothing on it can be trusted.
      for (auto& [id, peer] : peers) break_peer(peer, Error{errc::backend, "verbs: the completion queue failed"});
      return events + 1;
    }
    for (int i = 0; i < n; ++i) (this->*handle)(wcs[static_cast<std::size_t>(i)]);
    events += static_cast<std::size_t>(n);
    if (n < poll_batch) return events;
  }
}

bool Backend::Engine::arm_for_sleep() {
  if (api->req_notify_cq(cq.get(), 0) != 0 || api->req_notify_cq(recv_cq.get(), 0) != 0) return false;
  if (progress() != 0) return false;  // completions that raced the arming
  if (!cq_wait_armed) {
    cq_wait_armed = true;
    // `this`: the handler lives in our own io_context.
    cq_wake->async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
      cq_wait_armed = false;
      if (!ec && !torn_down()) consume_cq_events();
    });
  }
  return true;
}

void Backend::Engine::consume_cq_events() {
  if (channel == nullptr) return;
  ibv_cq* event_cq = nullptr;
  void* context = nullptr;
  unsigned send_events = 0;
  unsigned receive_events = 0;
  while (api->get_cq_event(channel.get(), &event_cq, &context) == 0) {
    ++(event_cq == recv_cq.get() ? receive_events : send_events);
  }
  if (send_events != 0) api->ack_cq_events(cq.get(), send_events);
  if (receive_events != 0) api->ack_cq_events(recv_cq.get(), receive_events);
}

void Backend::Engine::arm_async_watch() {
  if (async_wait_armed || torn_down()) return;
  async_wait_armed = true;
  async_wake->async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    async_wait_armed = false;
    if (ec || torn_down()) return;
    drain_async_events();
    arm_async_watch();
  });
}

void Backend::Engine::drain_async_events() {
  ibv_async_event event{};
  while (api->get_async_event(device.context.get(), &event) == 0) {
    const std::string what = std::string("verbs: ") + api->event_type_str(event.event_type);
    switch (event.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR:
        for (auto& [id, peer] : peers) {
          if (peer.qp.get() == event.element.qp) break_peer(peer, Error{errc::peer_unreachable, what});
        }
        break;
      case IBV_EVENT_CQ_ERR:
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_DEVICE_FATAL:
        for (auto& [id, peer] : peers) break_peer(peer, Error{errc::peer_unreachable, what});
        break;
      default:  // informational: communication established, port active, GID change...
        break;
    }
    api->ack_async_event(&event);
  }
}

// ---- shutdown ----

void Backend::Engine::close_peers() {
  // Every queue pair to the error state: its posted work flushes, its
  // backlog is failed unposted.
  for (auto& [id, peer] : peers) break_peer(peer, shut_down_error());
  progress_until([this] {
    return outstanding_total == 0 &&
           std::all_of(peers.begin(), peers.end(), [](const auto& entry) { return entry.second.receives_posted == 0; });
  });
}

}  // namespace corma::verbs
