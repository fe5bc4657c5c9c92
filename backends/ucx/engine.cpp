#include "engine.hpp"

#include "wire.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <cstring>
#include <string>

namespace corma::ucx {

Error ucs_error(errc code, const char* call, ucs_status_t status) {
  return Error{code, std::string(call) + ": " + ucs_status_string(status)};
}

namespace {

using backend_kit::answer;

backend_kit::EngineSettings settings_of(const Config& c) {
  return {"UCX", c.progress, c.spin_time, c.command_queue_capacity, c.operation_timeout, c.shutdown_timeout};
}

}  // namespace

Backend::Engine::Engine(const Config& c)
    : TransferEngine(settings_of(c)), config(c), rma(c.trusted_peers || c.transport == Transport::shared_memory) {}

Result<void> Backend::Engine::start() {
  ucp_config_t* ucp_config = nullptr;
  if (auto st = ucp_config_read(nullptr, nullptr, &ucp_config); st != UCS_OK) {
    return ucs_error(errc::not_configured, "ucp_config_read", st);
  }
  // The listening surface: shared memory opens no socket; untrusted tcp
  // makes no peers, so it needs no network interface either (`self` still
  // registers local memory); trusted tcp listens where the operator said.
  const bool tcp = config.transport == Transport::tcp;
  ucp_config_modify(ucp_config, "TLS", !tcp ? "sm" : rma ? "tcp" : "self");
  if (tcp && rma && !config.tcp_interface.empty()) {
    ucp_config_modify(ucp_config, "NET_DEVICES", config.tcp_interface.c_str());
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // Large regions are mapped on the engine's registration thread while the
  // progress thread drives the workers: the context's own calls
  // (ucp_mem_map, ucp_rkey_pack, ucp_mem_unmap) must then take its lock.
  params.mt_workers_shared = 1;
  // Without trust, RMA is not even enabled: UCX then serves no emulated
  // get/put for anyone (see Config::trusted_peers).
  params.features = UCP_FEATURE_WAKEUP | UCP_FEATURE_AM | (rma ? UCP_FEATURE_RMA | UCP_FEATURE_AMO64 : 0);
  const auto init = ucp_init(&params, ucp_config, &context);
  ucp_config_release(ucp_config);
  if (init != UCS_OK) return ucs_error(errc::not_configured, "ucp_init", init);

  if (auto opened = accepting.open(context, io); !opened) {
    ucp_cleanup(context);
    context = nullptr;
    return std::move(opened).error();
  }

  ucp_address_t* address = nullptr;
  std::size_t address_len = 0;
  if (auto st = ucp_worker_get_address(accepting.handle(), &address, &address_len); st != UCS_OK) {
    tear_down();
    return ucs_error(errc::not_configured, "ucp_worker_get_address", st);
  }
  const auto* bytes = reinterpret_cast<const std::byte*>(address);
  own_address.assign(bytes, bytes + address_len);
  ucp_worker_release_address(accepting.handle(), address);
  if (rma) {
    if (auto listening = listen_for_notifications(accepting.handle()); !listening) {
      tear_down();
      return std::move(listening).error();
    }
  }

  if (rma) {
    // The memory domains our keys use: peers' keys must name a subset.
    static std::byte probe[64];
    ucp_mem_map_params_t map{};
    map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    map.address = probe;
    map.length = sizeof probe;
    ucp_mem_h memh = nullptr;
    void* rkey = nullptr;
    std::size_t rkey_size = 0;
    if (ucp_mem_map(context, &map, &memh) == UCS_OK) {
      if (ucp_rkey_pack(context, memh, &rkey, &rkey_size) == UCS_OK) {
        if (rkey_size >= sizeof local_md_map) std::memcpy(&local_md_map, rkey, sizeof local_md_map);
        ucp_rkey_buffer_release(rkey);
      }
      ucp_mem_unmap(context, memh);
    }
  }
  return success();
}

// ---- progress ----

std::size_t Backend::Engine::progress() {
  if (torn_down()) return 0;
  flush_puts();
  std::size_t events = 0;
  events += accepting.progress();
  events += connecting.progress();
  put_flushes.remove_if([](const PutFlush& flush) { return flush.done; });
  events += handle_notification_messages();
  // Completions recorded inside UCX callbacks are finished here, outside
  // UCX, where unmapping and answering callers is safe.
  while (!finished.empty()) {
    auto done = std::move(finished);
    finished.clear();
    for (auto id : done) {
      if (auto* op = find_transfer(id)) {
        finish_transfer(id, op->status);
      } else {
        release_orphan(id);
      }
    }
    ++events;
  }
  poll_closing();
  return events;
}

void Backend::Engine::poll_closing() {
  for (auto it = closing_endpoints.begin(); it != closing_endpoints.end();) {
    if (it->request != nullptr && ucp_request_check_status(it->request) == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    if (it->request != nullptr) ucp_request_free(it->request);
    if (it->op) answer(*it->op, success());
    const auto abandoned = it->abandoned;
    it = closing_endpoints.erase(it);
    if (abandoned) orphan_transfers_of(*abandoned);
  }
}

bool Backend::Engine::arm_for_sleep() {
  // Both, every time: the thread wakes on whichever has an event.
  const bool accepting_idle = accepting.arm_for_sleep();
  const bool connecting_idle = connecting.arm_for_sleep();
  return accepting_idle && connecting_idle;
}

// ---- map / unmap ----

Result<backend_kit::EngineCore::Registration> Backend::Engine::provider_map(void* ptr, std::size_t len,
                                                                          Access access) {
  if (access != Access::local && !rma) {
    return fail(errc::not_configured, "remote access over software-emulated tcp needs trusted_peers");
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = ptr;
  params.length = len;
  ucp_mem_h memh = nullptr;
  if (auto st = ucp_mem_map(context, &params, &memh); st != UCS_OK) {
    return ucs_error(errc::backend, "ucp_mem_map", st);
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucp_mem_query(memh, &attr) != UCS_OK) {
    attr.address = ptr;
    attr.length = len;
  }
  PackedKey key;
  if (access != Access::local) {
    void* rkey = nullptr;
    std::size_t rkey_size = 0;
    if (auto st = ucp_rkey_pack(context, memh, &rkey, &rkey_size); st != UCS_OK) {
      ucp_mem_unmap(context, memh);
      return ucs_error(errc::backend, "ucp_rkey_pack", st);
    }
    key = wire::encode_key(reinterpret_cast<std::uint64_t>(ptr), len, access,
                           {static_cast<const std::byte*>(rkey), rkey_size});
    ucp_rkey_buffer_release(rkey);
  }
  return Registration{memh, reinterpret_cast<std::uint64_t>(attr.address), attr.length, std::move(key)};
}

Result<void> Backend::Engine::provider_unmap(void* handle) {
  if (auto st = ucp_mem_unmap(context, static_cast<ucp_mem_h>(handle)); st != UCS_OK) {
    return ucs_error(errc::backend, "ucp_mem_unmap", st);
  }
  return success();
}

// ---- transfers ----

namespace {

const char* provider_call(backend_kit::TransferKind kind) {
  switch (kind) {
    case backend_kit::TransferKind::get: return "ucp_get_nbx";
    case backend_kit::TransferKind::put: return "ucp_put_nbx";
    case backend_kit::TransferKind::atomic: return "ucp_atomic_op_nbx";
    case backend_kit::TransferKind::flush: return "ucp_ep_flush_nbx";
    case backend_kit::TransferKind::notify: return "ucp_am_send_nbx";
  }
  return "ucp";
}

}  // namespace

Result<SharedRemoteKey> Backend::Engine::unpack_key(const PackedKey& packed, Peer& peer) {
  CORMA_TRY(auto decoded, wire::decode_key(packed, local_md_map));
  ucp_rkey_h rkey = nullptr;
  if (auto st = ucp_ep_rkey_unpack(peer.ep, decoded.rkey.data(), &rkey); st != UCS_OK) {
    return ucs_error(errc::invalid_key, "ucp_ep_rkey_unpack", st);
  }
  return std::make_shared<const RemoteKey>(rkey, decoded.addr, decoded.len, decoded.access);
}

Result<SharedRemoteKey> Backend::Engine::remote_key(const TransferRequest& req, bool is_put, Peer& peer) {
  CORMA_TRY(auto key, find_key(req.key, peer));
  CORMA_TRY(validate_remote_range(is_put, req, key->addr(), key->len(), key->access()));
  return key;
}

Result<SharedRemoteKey> Backend::Engine::find_key(const TransferKey& named, Peer& peer) {
  SharedRemoteKey key;
  if (const auto* id = std::get_if<RemoteKeyId>(&named)) {
    auto imported = peer.imported.find(*id);
    if (imported == peer.imported.end()) return fail(errc::invalid_key, "no key imported under that id for this peer");
    key = imported->second;
  } else {
    const auto& packed = std::get<PackedKey>(named);
    if (auto cached = peer.keys.find(packed); cached != peer.keys.end()) {
      key = cached->second;
    } else {
      CORMA_TRY(key, unpack_key(packed, peer));
      // Past the cap, the key is unpacked for this transfer only.
      if (peer.keys.size() < max_cached_keys) peer.keys.emplace(packed, key);
    }
  }
  return key;
}

Result<Backend::Engine::Peer*> Backend::Engine::initiator_peer(const UcxTransferOp& op) {
  if (op.cancelled.load(std::memory_order_acquire)) {
    return fail(errc::cancelled, std::string(backend_kit::kind_name(op.kind)) + " cancelled before it ran");
  }
  if (closed()) return shut_down_error();
  auto peer = peers.find(op.request.peer);
  if (peer == peers.end()) return fail(errc::peer_unreachable, "unknown peer");
  if (peer->second.broken) return fail(errc::peer_unreachable, "peer is broken");
  if (peer->second.reader) return fail(errc::not_configured, "peer accepted read-only: the reader connects");
  if (peer->second.ep == nullptr) return fail(errc::peer_unreachable, "peer set-up is not complete");
  if (!rma) return fail(errc::not_configured, "RMA over software-emulated tcp needs trusted_peers");
  return &peer->second;
}

ucp_request_param_t Backend::Engine::callback_param(UcxTransferOp& op) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &Engine::on_transfer_done;
  param.user_data = &op;
  op.finished = &finished;
  return param;
}

void Backend::Engine::issued(const UcxTransferOp& op, ucs_status_ptr_t handle) {
  if (UCS_PTR_IS_ERR(handle)) return finish_transfer(op.id, UCS_PTR_STATUS(handle));
  if (handle == nullptr) return finish_transfer(op.id, UCS_OK);
}

void Backend::Engine::run_transfer(const std::shared_ptr<UcxTransferOp>& op) {
  if (op->cancelled.load(std::memory_order_acquire)) {
    return answer(*op, fail(errc::cancelled, "transfer cancelled before it ran"));
  }
  auto region = admit_local(op->request);
  if (!region) return answer(*op, std::move(region).error());
  auto peer = initiator_peer(*op);
  if (!peer) return answer(*op, std::move(peer).error());
  const auto& req = op->request;
  auto key = remote_key(req, op->kind == backend_kit::TransferKind::put, *peer.value());
  if (!key) return answer(*op, std::move(key).error());
  op->key = std::move(key).value();
  track(op, *region.value());
  peer.value()->wire_up_started = true;

  auto param = callback_param(*op);
  std::byte* local = region.value()->addr + req.local_offset;
  ucp_ep_h ep = peer.value()->ep;
  if (op->kind == backend_kit::TransferKind::put) return issue_put(op, ep, local);
  if (req.blocks == 1) return issued(*op, ucp_get_nbx(ep, local, req.len, req.remote_addr, op->key->handle(), &param));
  // Strided: the blocks go with no callback, and one endpoint flush behind
  // them (it completes after each of them) answers the transfer.
  op->post_status = post_blocks(ep, false, req, local, op->key->handle()).status;
  issued(*op, ucp_ep_flush_nbx(ep, &param));
}

void Backend::Engine::run_atomic(const std::shared_ptr<UcxTransferOp>& op) {
  auto peer = initiator_peer(*op);
  if (!peer) return answer(*op, std::move(peer).error());
  auto& atomic = op->atomic;
  auto key = find_key(atomic.key, *peer.value());
  if (!key) return answer(*op, std::move(key).error());
  const auto& remote = *key.value();
  if (auto word = validate_atomic_word(atomic.remote_addr, remote.addr(), remote.len(), remote.access()); !word) {
    return answer(*op, std::move(word).error());
  }
  op->key = std::move(key).value();
  track(op);
  peer.value()->wire_up_started = true;

  auto param = callback_param(*op);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(atomic_word_size);
  // UCX's operand is `buffer`; what comes back lands in the reply buffer,
  // which for a compare-and-swap carries the value to store on the way in.
  // Every atomic asks for a reply, `add` too (into a slot nobody reads): an
  // atomic without one completes when it leaves, not when it is applied.
  ucp_atomic_op_t opcode = UCP_ATOMIC_OP_ADD;
  const std::uint64_t* buffer = &atomic.operand;
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  param.reply_buffer = atomic.op == AtomicOp::add ? &op->unread_reply : &op->fetched;
  if (atomic.op == AtomicOp::swap) opcode = UCP_ATOMIC_OP_SWAP;
  if (atomic.op == AtomicOp::compare_swap) {
    opcode = UCP_ATOMIC_OP_CSWAP;
    op->fetched = atomic.operand;
    buffer = &atomic.compare;
  }
  issued(*op, ucp_atomic_op_nbx(peer.value()->ep, opcode, buffer, 1, atomic.remote_addr, op->key->handle(), &param));
}

void Backend::Engine::run_flush(const std::shared_ptr<UcxTransferOp>& op) {
  auto peer = initiator_peer(*op);
  if (!peer) return answer(*op, std::move(peer).error());
  // The puts of this turn are flushed first; the endpoint flush behind them
  // completes after every operation issued on the endpoint before it.
  flush_puts();
  track(op);
  auto param = callback_param(*op);
  issued(*op, ucp_ep_flush_nbx(peer.value()->ep, &param));
}

void Backend::Engine::forget_keys(Peer& peer) {
  peer.keys.clear();
  peer.imported.clear();
}

void Backend::Engine::run_import_key(const std::shared_ptr<ValueOp<RemoteKeyId>>& op) {
  auto peer = peers.find(op->peer);
  const std::size_t imported = peer == peers.end() ? 0 : peer->second.imported.size();
  if (auto room = check_import(op->blob, imported); !room) return op->completion.dispatch(std::move(room).error());
  if (peer == peers.end() || peer->second.broken) {
    return op->completion.dispatch(fail(errc::peer_unreachable, "unknown or broken peer"));
  }
  if (peer->second.reader) {
    return op->completion.dispatch(fail(errc::not_configured, "peer accepted read-only: the reader connects"));
  }
  if (peer->second.ep == nullptr) {
    return op->completion.dispatch(fail(errc::peer_unreachable, "peer set-up is not complete"));
  }
  auto key = unpack_key(op->blob, peer->second);
  if (!key) return op->completion.dispatch(std::move(key).error());
  const RemoteKeyId id{new_id()};
  peer->second.imported.emplace(id, std::move(key).value());
  op->completion.dispatch(id);
}

void Backend::Engine::run_release_key(const std::shared_ptr<VoidOp>& op, RemoteKeyId key_id) {
  if (closed()) return answer(*op, shut_down_error());
  for (auto& [peer_id, peer] : peers) {
    // Transfers admitted with it keep it until they end.
    if (peer.imported.erase(key_id) != 0) break;
  }
  answer(*op, success());  // idempotent
}

void Backend::Engine::on_transfer_done(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<UcxTransferOp*>(user_data);
  ucp_request_free(request);
  op->status = status;
  // Recorded, not finished: we are inside ucp_worker_progress.
  op->finished->push_back(op->id);
}

void Backend::Engine::finish_transfer(std::uint64_t id, ucs_status_t status) {
  if (auto* pending = find_transfer(id); pending != nullptr && status == UCS_OK &&
                                         pending->kind == backend_kit::TransferKind::notify &&
                                         !notification_answered(*pending)) {
    return;  // its next step is under way
  }
  auto taken = untrack(id);
  if (!taken) return;
  auto& op = *taken;
  // A whole batch's flush may end well behind an element UCX refused.
  if (status == UCS_OK) status = op.post_status;

  // The caller hears of its transfer before an unmap that waited for it.
  if (status == UCS_OK) {
    if (auto peer = peers.find(op.request.peer); peer != peers.end()) peer->second.wired = true;
    answer(op, op.kind == backend_kit::TransferKind::notify ? acknowledged(op) : success());
  } else if (status == UCS_ERR_CANCELED && closing()) {
    answer(op, shut_down_error());
  } else {
    auto peer = peers.find(op.request.peer);
    const bool broken = peer == peers.end() || peer->second.broken;
    answer(op, ucs_error(broken ? errc::peer_unreachable : errc::backend,
                         op.whole_batch ? "ucp_ep_flush_nbx" : provider_call(op.kind), status));
  }
  release_holds(op);
}

void Backend::Engine::release_holds(UcxTransferOp& op) {
  op.key.reset();
  op.run_keys.clear();
  unpin_transfer(op);
}

void Backend::Engine::on_transfer_deadline(UcxTransferOp& op) {
  auto peer = peers.find(op.request.peer);
  if (peer != peers.end()) abandon_endpoint(peer->first, peer->second);
}

bool Backend::Engine::can_force_close() const noexcept {
  // UCX refuses UCP_EP_CLOSE_FLAG_FORCE on an endpoint without peer error
  // handling (UCS_ERR_INVALID_PARAM, nothing closed), and a flushing close
  // waits for transfers that a dead peer never completes.
  return config.error_handling == ErrorHandling::peer;
}

void Backend::Engine::abandon_endpoint(PeerId id, Peer& peer) {
  flush_puts();  // the puts issued this turn end with the endpoint
  peer.broken = true;
  if (!can_force_close()) return strand_transfers_of(id, peer);
  forget_keys(peer);
  if (peer.ep == nullptr) return;
  note_endpoint_closing(peer);
  // Forced: UCX fails whatever is still in flight on it, which unpins the
  // local regions those transfers held (an unmap may be waiting for them).
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(peer.ep, &param);
  peer.ep = nullptr;
  closing_endpoints.push_back(
      Closing{request != nullptr && !UCS_PTR_IS_ERR(request) ? request : nullptr, {}, id});
}

void Backend::Engine::orphan_transfers_of(PeerId peer) {
  for (auto id : transfers_where([peer](const UcxTransferOp& op) { return op.request.peer == peer; })) {
    orphans.emplace(id, share_transfer(id));
    finish_transfer(id, UCS_ERR_CANCELED);
  }
}

// Without peer error handling UCX has no way to end a transfer whose peer
// died: its request stays pending until the worker is destroyed (cancelling
// it does not end an RMA operation, and neither a forced nor a flushing
// close can end the endpoint). Its caller is answered at once instead; the
// request keeps its local region pinned (an unmap waits for it), its key and
// its endpoint until UCX completes it or the worker goes, so nothing is
// unmapped, destroyed or freed under it.
void Backend::Engine::strand_transfers_of(PeerId id, Peer& peer) {
  flush_puts();
  forget_keys(peer);  // each stranded transfer holds its own
  peer.ep = nullptr;  // left to the worker's destruction
  for (auto transfer_id : transfers_where([id](const UcxTransferOp& op) { return op.request.peer == id; })) {
    auto op = untrack(transfer_id);
    answer(*op, provider_error(errc::peer_unreachable,
                               std::string(backend_kit::kind_name(op->kind)) +
                                   " given up with its peer: without peer error handling it cannot be ended, "
                                   "and its local region stays registered until it is"));
    stranded.emplace(transfer_id, std::move(op));
  }
}

void Backend::Engine::release_orphan(std::uint64_t id) {
  // UCX completed its request: it never touches it again.
  if (orphans.erase(id) != 0) return;  // its region was released with its closed endpoint
  auto it = stranded.find(id);
  if (it == stranded.end()) return;
  auto op = std::move(it->second);
  stranded.erase(it);
  release_holds(*op);
}

// ---- peers ----
// The peer that reads connects. A one-sided get or put needs an endpoint only
// on its initiator, so the initiator offers a bare record, the target answers
// with its worker address and creates no endpoint, and only the initiator
// hands an address to UCX: the target's, which it chose to connect to.
// Nothing a target reads from its control connection reaches UCX.

Result<ucp_ep_h> Backend::Engine::create_endpoint(const std::vector<std::byte>& address) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  if (config.error_handling == ErrorHandling::peer) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Engine::on_endpoint_error;
    params.err_handler.arg = this;
  } else {
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  }
  if (!connecting.is_open()) {
    CORMA_TRY(connecting.open(context, io));
    // Acknowledgements of our notifications arrive on this worker.
    if (auto listening = listen_for_notifications(connecting.handle()); !listening) {
      connecting.destroy();
      return std::move(listening).error();
    }
  }
  ucp_ep_h ep = nullptr;
  if (auto st = ucp_ep_create(connecting.handle(), &params, &ep); st != UCS_OK) {
    return ucs_error(errc::peer_unreachable, "ucp_ep_create", st);
  }
  return ep;
}

void Backend::Engine::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t) {
  static_cast<Engine*>(arg)->mark_broken(ep);
}

void Backend::Engine::mark_broken(ucp_ep_h ep) {
  for (auto& [id, peer] : peers) {
    if (peer.ep == ep) peer.broken = peer.failed = true;
  }
}

Result<void> Backend::Engine::peers_allowed() const {
  if (closed()) return shut_down_error();
  if (!rma) return fail(errc::not_configured, "UCX over untrusted tcp makes no peers");
  return success();
}

void Backend::Engine::run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op) {
  if (auto allowed = peers_allowed(); !allowed) return op->completion.dispatch(std::move(allowed).error());
  const PeerId id{new_id()};
  peers.emplace(id, Peer{});
  op->completion.dispatch(PeerOffer{id, wire::encode_offer()});
}

namespace {

/// A notification token from the kernel's cryptographic random source: a
/// peer that saw other peers' tokens learns nothing of the next one (a
/// seeded generator's outputs give its state away after a few hundred).
std::uint64_t unguessable_token() {
  std::uint64_t token = 0;
  auto* bytes = reinterpret_cast<char*>(&token);
  std::size_t filled = 0;
  while (filled < sizeof token) {
    const auto got = ::getrandom(bytes + filled, sizeof token - filled, 0);
    if (got > 0) {
      filled += static_cast<std::size_t>(got);
    } else if (errno != EINTR) {
      // No getrandom (a kernel before 3.17): the device it reads from.
      std::random_device device("/dev/urandom");
      return (std::uint64_t{device()} << 32) | device();
    }
  }
  return token;
}

}  // namespace

void Backend::Engine::run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op) {
  if (auto allowed = peers_allowed(); !allowed) return op->completion.dispatch(std::move(allowed).error());
  if (auto offer = wire::decode_offer(op->blob); !offer) return op->completion.dispatch(std::move(offer).error());
  const PeerId id{new_id()};
  Peer peer;
  peer.reader = true;
  do {
    peer.notify_token = unguessable_token();
  } while (peer.notify_token == 0 || notify_tokens.contains(peer.notify_token));
  notify_tokens.emplace(peer.notify_token, id);
  const auto token = peer.notify_token;
  peers.emplace(id, std::move(peer));
  op->completion.dispatch(PeerAnswer{id, wire::encode_address(token, own_address)});
}

void Backend::Engine::run_peer_complete(const std::shared_ptr<ValueOp<void>>& op) {
  if (closed()) return op->completion.dispatch(shut_down_error());
  auto it = peers.find(op->peer);
  if (it == peers.end()) return op->completion.dispatch(fail(errc::peer_unreachable, "no pending peer with that id"));
  if (it->second.ep != nullptr || it->second.broken || it->second.reader) {
    return op->completion.dispatch(fail(errc::protocol, "peer is not waiting for an answer"));
  }
  auto address = wire::decode_address(op->blob);
  if (!address) return op->completion.dispatch(std::move(address).error());
  auto ep = create_endpoint(address.value().address);
  if (!ep) return op->completion.dispatch(std::move(ep).error());
  it->second.ep = ep.value();
  it->second.notify_token = address.value().token;
  op->completion.dispatch(success());
}

void Backend::Engine::run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id) {
  flush_puts();
  if (closed()) return answer(*op, shut_down_error());
  auto it = peers.find(id);
  if (it == peers.end()) return answer(*op, success());  // idempotent
  ucp_ep_h ep = it->second.ep;
  // An accepted peer's notifications are refused from now on.
  if (it->second.reader) notify_tokens.erase(it->second.notify_token);
  // A peer closed with transfers still in flight is one its user gave up
  // on (its owner died, say): a flush would wait for them until their
  // deadline. Forced, UCX fails them now, which unpins their regions.
  const bool busy = !transfers_where([id](const UcxTransferOp& t) { return t.request.peer == id; }).empty();
  const bool force = it->second.broken || busy;
  if (force && !can_force_close()) {
    strand_transfers_of(id, it->second);
    peers.erase(it);
    return answer(*op, success());
  }
  forget_keys(it->second);
  if (ep != nullptr) note_endpoint_closing(it->second);
  peers.erase(it);
  if (ep == nullptr) return answer(*op, success());
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return answer(*op, success());
  closing_endpoints.push_back(Closing{request, op, std::nullopt});
}

void Backend::Engine::forget_transfer(UcxTransferOp& op) {
  op.key.reset();
  op.run_keys.clear();
}

}  // namespace corma::ucx
