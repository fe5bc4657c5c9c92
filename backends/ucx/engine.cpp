#include "engine.hpp"

#include "wire.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace corma::ucx {
namespace {

Error ucs_error(errc code, const char* call, ucs_status_t status) {
  return Error{code, std::string(call) + ": " + ucs_status_string(status)};
}

template <class Op, class T>
void answer(Op& op, T&& result) {
  if (op.answered) return;
  op.answered = true;
  op.completion.dispatch(std::forward<T>(result));
}

const Error shut_down_error{errc::shutting_down, "UCX backend is shutting down"};

}  // namespace

Backend::Engine::Engine(const Config& c)
    : config(c),
      rma(c.trusted_peers || c.transport == Transport::shared_memory),
      map_answer_delay_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(c.map_answer_delay).count()) {}

Result<void> Backend::Engine::start() {
  ucp_config_t* ucp_config = nullptr;
  if (auto st = ucp_config_read(nullptr, nullptr, &ucp_config); st != UCS_OK) {
    return ucs_error(errc::not_configured, "ucp_config_read", st);
  }
  const char* tls = config.transport == Transport::tcp ? "tcp" : "sm";
  ucp_config_modify(ucp_config, "TLS", tls);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // Without trust, RMA is not even enabled: UCX then serves no emulated
  // get/put for anyone (see Config::trusted_peers).
  params.features = UCP_FEATURE_WAKEUP | (rma ? UCP_FEATURE_RMA : UCP_FEATURE_AM);
  const auto init = ucp_init(&params, ucp_config, &context);
  ucp_config_release(ucp_config);
  if (init != UCS_OK) return ucs_error(errc::not_configured, "ucp_init", init);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (auto st = ucp_worker_create(context, &worker_params, &worker); st != UCS_OK) {
    ucp_cleanup(context);
    return ucs_error(errc::not_configured, "ucp_worker_create", st);
  }

  ucp_address_t* address = nullptr;
  std::size_t address_len = 0;
  if (auto st = ucp_worker_get_address(worker, &address, &address_len); st != UCS_OK) {
    tear_down();
    return ucs_error(errc::not_configured, "ucp_worker_get_address", st);
  }
  const auto* bytes = reinterpret_cast<const std::byte*>(address);
  own_address.assign(bytes, bytes + address_len);
  ucp_worker_release_address(worker, address);

  int efd = -1;
  if (auto st = ucp_worker_get_efd(worker, &efd); st != UCS_OK) {
    tear_down();
    return ucs_error(errc::not_configured, "ucp_worker_get_efd", st);
  }
  wake.emplace(io, ::dup(efd));  // asio closes its own copy

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

void Backend::Engine::tear_down() {
  if (deadline_sweep) deadline_sweep->cancel();
  if (wake) {
    boost::system::error_code ignored;
    wake->close(ignored);
    wake.reset();
  }
  if (worker != nullptr) ucp_worker_destroy(worker);
  orphans.clear();  // no callback can reach them any more
  if (context != nullptr) ucp_cleanup(context);
  worker = nullptr;
  context = nullptr;
  torn_down = true;
}

void Backend::Engine::quit() {
  quitting = true;
  work.reset();
}

// ---- progress ----

std::size_t Backend::Engine::progress() {
  if (torn_down) return 0;
  std::size_t events = 0;
  while (ucp_worker_progress(worker) != 0) ++events;
  // Completions recorded inside UCX callbacks are finished here, outside
  // UCX, where unmapping and answering callers is safe.
  while (!finished.empty()) {
    auto done = std::move(finished);
    finished.clear();
    for (auto id : done) {
      auto it = transfers.find(id);
      if (it != transfers.end()) finish_transfer(id, it->second->status);
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

void Backend::Engine::wait_for_events() {
  if (!torn_down) {
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) return;  // events pending: progress again
    if (!wake_armed) {
      wake_armed = true;
      wake->async_wait(asio::posix::stream_descriptor::wait_read,
                       [this](boost::system::error_code) { wake_armed = false; });
    }
  }
  io.run_one();  // a command, a timer, or the worker's event fd
}

void Backend::Engine::loop() {
  using clock = std::chrono::steady_clock;
  auto last_activity = clock::now();
  run_until_quit(last_activity);
  // Whatever was posted before the end (cancelled timers, late commands) runs
  // now and is answered shutting_down, so no handler outlives the loop
  // holding the engine.
  io.restart();
  while (io.poll() != 0) {
  }
}

void Backend::Engine::run_until_quit(std::chrono::steady_clock::time_point last_activity) {
  using clock = std::chrono::steady_clock;
  while (!quitting) {
    const std::size_t ran = io.poll();
    const std::size_t progressed = progress();
    if (quitting) break;
    const auto now = clock::now();
    if (ran != 0 || progressed != 0) {
      last_activity = now;
      continue;
    }
    if (!torn_down) {
      if (config.progress == ProgressMode::busy_poll) continue;
      if (config.progress == ProgressMode::adaptive && now - last_activity < config.spin_time) continue;
    }
    wait_for_events();
    last_activity = clock::now();
  }
}

// ---- map / unmap ----

void Backend::Engine::run_map(const std::shared_ptr<MapOp>& op) {
  if (op->cancelled.load(std::memory_order_acquire)) {
    return answer(*op, fail(errc::cancelled, "map cancelled before it ran"));
  }
  if (closed()) return answer(*op, shut_down_error);
  if (auto valid = validate_range(op->ptr, op->len); !valid) return answer(*op, std::move(valid).error());
  if (op->access != Access::local && !rma) {
    return answer(*op, fail(errc::not_configured,
                            "remote access over software-emulated tcp needs trusted_peers"));
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = op->ptr;
  params.length = op->len;
  ucp_mem_h memh = nullptr;
  if (auto st = ucp_mem_map(context, &params, &memh); st != UCS_OK) {
    return answer(*op, ucs_error(errc::backend, "ucp_mem_map", st));
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucp_mem_query(memh, &attr) != UCS_OK) {
    attr.address = op->ptr;
    attr.length = op->len;
  }
  PackedKey key;
  if (op->access != Access::local) {
    void* rkey = nullptr;
    std::size_t rkey_size = 0;
    if (auto st = ucp_rkey_pack(context, memh, &rkey, &rkey_size); st != UCS_OK) {
      ucp_mem_unmap(context, memh);
      return answer(*op, ucs_error(errc::backend, "ucp_rkey_pack", st));
    }
    key = wire::encode_key(reinterpret_cast<std::uint64_t>(op->ptr), op->len,
                           {static_cast<const std::byte*>(rkey), rkey_size});
    ucp_rkey_buffer_release(rkey);
  }
  const RegionId id{next_id++};
  regions.emplace(id, Region{memh, static_cast<std::byte*>(op->ptr), op->len, 0, false, {}});
  live.fetch_add(1, std::memory_order_acq_rel);
  op->mapped = id;
  op->result = BackendRegion{id, reinterpret_cast<std::uint64_t>(attr.address), attr.length, std::move(key)};
  if (const std::chrono::nanoseconds delay{map_answer_delay_ns.load(std::memory_order_acquire)};
      delay.count() > 0) {
    op->id = next_id++;
    delayed_maps.emplace(op->id, op);
    op->timer = std::make_unique<asio::steady_timer>(io, delay);
    op->timer->async_wait([this, op](boost::system::error_code ec) {
      if (!ec) deliver_map(op);
    });
    return;
  }
  deliver_map(op);
}

void Backend::Engine::deliver_map(const std::shared_ptr<MapOp>& op) {
  delayed_maps.erase(op->id);
  if (op->answered) return;
  if (op->cancelled.load(std::memory_order_acquire)) {
    // Mapped but not yet answered: the total guarantee says undo it.
    release_region(*op->mapped);
    return answer(*op, fail(errc::cancelled, "map cancelled"));
  }
  op->answered = true;
  const RegionId id = *op->mapped;
  op->completion.dispatch_or_rollback(
      [weak = weak_from_this(), id] {
        if (auto self = weak.lock()) {
          asio::post(self->io, [weak, id] {
            if (auto alive = weak.lock()) alive->release_region(id);
          });
        }
      },
      std::move(op->result));
  maps_answered.fetch_add(1, std::memory_order_acq_rel);
}

void Backend::Engine::cancel_map(const std::shared_ptr<MapOp>& op) {
  if (op->answered || !op->mapped) return;  // not run yet: run_map sees the flag
  if (op->timer) op->timer->cancel();
  deliver_map(op);
}

void Backend::Engine::release_region(RegionId id) {
  auto it = regions.find(id);
  if (it == regions.end() || torn_down) return;
  if (it->second.transfers > 0) {
    it->second.unmapping = true;
    return;
  }
  unmap_now(it);
}

void Backend::Engine::unmap_now(std::map<RegionId, Region>::iterator it) {
  const auto st = ucp_mem_unmap(context, it->second.memh);
  auto waiters = std::move(it->second.unmap_waiters);
  if (st != UCS_OK) {
    it->second.unmapping = false;
    for (auto& w : waiters) answer(*w, ucs_error(errc::backend, "ucp_mem_unmap", st));
    return;
  }
  regions.erase(it);
  live.fetch_sub(1, std::memory_order_acq_rel);
  for (auto& w : waiters) answer(*w, success());
}

void Backend::Engine::run_unmap(const std::shared_ptr<VoidOp>& op, RegionId id) {
  if (closed()) return answer(*op, shut_down_error);
  auto it = regions.find(id);
  if (it == regions.end()) return answer(*op, success());  // idempotent
  it->second.unmap_waiters.push_back(op);
  if (it->second.transfers > 0) {
    it->second.unmapping = true;  // the last transfer out unmaps
    return;
  }
  unmap_now(it);
}

void Backend::Engine::cancel_unmap(const std::shared_ptr<VoidOp>& op) {
  answer(*op, fail(errc::cancelled, "unmap notification abandoned; the unmap proceeds"));
}

// ---- transfers ----

Result<void> Backend::Engine::admit_transfer(TransferOp& op) {
  const auto& req = op.request;
  if (closed()) return shut_down_error;
  if (req.len == 0) return fail(errc::out_of_range, "zero-length transfer");
  auto region = regions.find(req.local);
  if (region == regions.end() || region->second.unmapping) {
    return fail(errc::region_not_found, "local region is not registered");
  }
  CORMA_TRY(validate_slice(req.local_offset, req.len, region->second.len));
  auto peer = peers.find(req.peer);
  if (peer == peers.end()) return fail(errc::peer_unreachable, "unknown peer");
  if (peer->second.broken) return fail(errc::peer_unreachable, "peer is broken");
  if (peer->second.ep == nullptr) return fail(errc::peer_unreachable, "peer set-up is not complete");
  if (!rma) return fail(errc::not_configured, "RMA over software-emulated tcp needs trusted_peers");
  auto& keys = peer->second.keys;
  auto cached = keys.find(req.packed_key);
  CachedKey key;
  if (cached != keys.end()) {
    key = cached->second;
  } else {
    CORMA_TRY(auto decoded, wire::decode_key(req.packed_key, local_md_map));
    key.addr = decoded.addr;
    key.len = decoded.len;
    if (auto st = ucp_ep_rkey_unpack(peer->second.ep, decoded.rkey.data(), &key.rkey); st != UCS_OK) {
      return ucs_error(errc::invalid_key, "ucp_ep_rkey_unpack", st);
    }
    if (keys.size() < max_cached_keys) {
      keys.emplace(req.packed_key, key);
    } else {
      op.owns_rkey = true;
    }
  }
  op.rkey = key.rkey;
  auto release_unowned = [&op] {
    if (op.owns_rkey) ucp_rkey_destroy(op.rkey);
    op.rkey = nullptr;
    op.owns_rkey = false;
  };
  if (req.remote_addr < key.addr) {
    release_unowned();
    return fail(errc::out_of_range, "remote address below the key's range");
  }
  if (auto inside = validate_slice(req.remote_addr - key.addr, req.len, key.len); !inside) {
    release_unowned();
    return inside;
  }
  ++region->second.transfers;
  return success();
}

void Backend::Engine::run_transfer(const std::shared_ptr<TransferOp>& op) {
  if (op->cancelled.load(std::memory_order_acquire)) {
    return answer(*op, fail(errc::cancelled, "transfer cancelled before it ran"));
  }
  if (auto admitted = admit_transfer(*op); !admitted) return answer(*op, std::move(admitted).error());

  const auto& req = op->request;
  op->id = next_id++;
  op->finished = &finished;
  transfers.emplace(op->id, op);
  in_flight.fetch_add(1, std::memory_order_acq_rel);

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &Engine::on_transfer_done;
  param.user_data = op.get();
  std::byte* local = regions.at(req.local).addr + req.local_offset;
  ucp_ep_h ep = peers.at(req.peer).ep;
  ucs_status_ptr_t handle = nullptr;
  if (op->is_put) {
    // A put completes locally (the source may be reused) before the target
    // has the bytes: the endpoint flush behind it is what says "done".
    ucp_request_param_t put_param{};
    ucs_status_ptr_t put = ucp_put_nbx(ep, local, req.len, req.remote_addr, op->rkey, &put_param);
    if (UCS_PTR_IS_ERR(put)) return finish_transfer(op->id, UCS_PTR_STATUS(put));
    if (put != nullptr) ucp_request_free(put);  // UCX releases it when it completes
    handle = ucp_ep_flush_nbx(ep, &param);
  } else {
    handle = ucp_get_nbx(ep, local, req.len, req.remote_addr, op->rkey, &param);
  }
  if (UCS_PTR_IS_ERR(handle)) return finish_transfer(op->id, UCS_PTR_STATUS(handle));
  if (handle == nullptr) return finish_transfer(op->id, UCS_OK);
  op->deadline = std::chrono::steady_clock::now() + config.operation_timeout;
  arm_deadline_sweep();
}

void Backend::Engine::arm_deadline_sweep() {
  if (sweep_armed || torn_down) return;
  if (!deadline_sweep) deadline_sweep.emplace(io);
  sweep_armed = true;
  // A quarter of the timeout: a deadline is noticed at most 25 % late.
  const auto tick = std::clamp<std::chrono::milliseconds>(config.operation_timeout / 4, std::chrono::milliseconds(1),
                                                          std::chrono::milliseconds(1000));
  deadline_sweep->expires_after(tick);
  // `this`, not a shared_ptr: the handler lives in our own io_context, so
  // a strong reference would keep the engine alive forever if the loop ended first.
  deadline_sweep->async_wait([this](boost::system::error_code ec) {
    sweep_armed = false;
    if (!ec) sweep_deadlines();
  });
}

void Backend::Engine::sweep_deadlines() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::uint64_t> late;
  for (const auto& [id, op] : transfers) {
    if (!op->answered && op->deadline <= now) late.push_back(id);
  }
  for (auto id : late) on_transfer_deadline(id);
  if (!transfers.empty()) arm_deadline_sweep();
}

void Backend::Engine::forget_keys(Peer& peer) {
  for (auto& [bytes, key] : peer.keys) ucp_rkey_destroy(key.rkey);
  peer.keys.clear();
}

void Backend::Engine::on_transfer_done(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<TransferOp*>(user_data);
  ucp_request_free(request);
  op->status = status;
  // Recorded, not finished: we are inside ucp_worker_progress.
  op->finished->push_back(op->id);
}

void Backend::Engine::finish_transfer(std::uint64_t id, ucs_status_t status) {
  auto it = transfers.find(id);
  if (it == transfers.end()) return;
  auto op = it->second;
  transfers.erase(it);
  in_flight.fetch_sub(1, std::memory_order_acq_rel);
  if (op->owns_rkey) ucp_rkey_destroy(op->rkey);
  op->rkey = nullptr;

  // The caller hears of its transfer before an unmap that waited for it.
  if (status == UCS_OK) {
    answer(*op, success());
  } else if (status == UCS_ERR_CANCELED && closing) {
    answer(*op, shut_down_error);
  } else {
    auto peer = peers.find(op->request.peer);
    const bool broken = peer == peers.end() || peer->second.broken;
    answer(*op, ucs_error(broken ? errc::peer_unreachable : errc::backend,
                          op->is_put ? "ucp_put_nbx" : "ucp_get_nbx", status));
  }
  auto region = regions.find(op->request.local);
  if (region != regions.end() && --region->second.transfers == 0 && region->second.unmapping) {
    unmap_now(region);
  }
}

void Backend::Engine::cancel_transfer(const std::shared_ptr<TransferOp>& op) {
  // UCX cannot cancel RMA: release the caller, keep the region pinned until
  // the transfer really ends.
  if (op->id != 0 && transfers.count(op->id) != 0) answer(*op, fail(errc::cancelled, "transfer cancelled"));
}

void Backend::Engine::on_transfer_deadline(std::uint64_t id) {
  auto it = transfers.find(id);
  if (it == transfers.end()) return;
  auto& op = *it->second;
  answer(op, fail(errc::timeout, "transfer passed its deadline; the peer is now treated as broken"));
  auto peer = peers.find(op.request.peer);
  if (peer != peers.end()) abandon_endpoint(peer->first, peer->second);
}

void Backend::Engine::abandon_endpoint(PeerId id, Peer& peer) {
  peer.broken = true;
  forget_keys(peer);
  if (peer.ep == nullptr) return;
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
  std::vector<std::uint64_t> ids;
  for (const auto& [id, op] : transfers) {
    if (op->request.peer == peer) ids.push_back(id);
  }
  for (auto id : ids) {
    orphans.push_back(transfers.at(id));
    finish_transfer(id, UCS_ERR_CANCELED);
  }
}

// ---- peers ----

Result<ucp_ep_h> Backend::Engine::create_endpoint(const std::vector<std::byte>& blob) {
  CORMA_TRY(auto address, wire::decode_address(blob));
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
  ucp_ep_h ep = nullptr;
  if (auto st = ucp_ep_create(worker, &params, &ep); st != UCS_OK) {
    return ucs_error(errc::peer_unreachable, "ucp_ep_create", st);
  }
  return ep;
}

void Backend::Engine::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t) {
  static_cast<Engine*>(arg)->mark_broken(ep);
}

void Backend::Engine::mark_broken(ucp_ep_h ep) {
  for (auto& [id, peer] : peers) {
    if (peer.ep == ep) peer.broken = true;
  }
}

void Backend::Engine::run_peer_offer(const std::shared_ptr<ValueOp<PeerOffer>>& op) {
  if (closed()) return op->completion.dispatch(shut_down_error);
  const PeerId id{next_id++};
  peers.emplace(id, Peer{});
  op->completion.dispatch(PeerOffer{id, wire::encode_address(own_address)});
}

void Backend::Engine::run_peer_accept(const std::shared_ptr<ValueOp<PeerAnswer>>& op) {
  if (closed()) return op->completion.dispatch(shut_down_error);
  auto ep = create_endpoint(op->blob);
  if (!ep) return op->completion.dispatch(std::move(ep).error());
  const PeerId id{next_id++};
  Peer peer;
  peer.ep = ep.value();
  peers.emplace(id, std::move(peer));
  op->completion.dispatch(PeerAnswer{id, wire::encode_address(own_address)});
}

void Backend::Engine::run_peer_complete(const std::shared_ptr<ValueOp<void>>& op) {
  if (closed()) return op->completion.dispatch(shut_down_error);
  auto it = peers.find(op->peer);
  if (it == peers.end()) return op->completion.dispatch(fail(errc::peer_unreachable, "no pending peer with that id"));
  if (it->second.ep != nullptr || it->second.broken) {
    return op->completion.dispatch(fail(errc::protocol, "peer is already connected"));
  }
  auto ep = create_endpoint(op->blob);
  if (!ep) return op->completion.dispatch(std::move(ep).error());
  it->second.ep = ep.value();
  op->completion.dispatch(success());
}

void Backend::Engine::run_peer_close(const std::shared_ptr<VoidOp>& op, PeerId id) {
  if (closed()) return answer(*op, shut_down_error);
  auto it = peers.find(id);
  if (it == peers.end()) return answer(*op, success());  // idempotent
  ucp_ep_h ep = it->second.ep;
  const bool broken = it->second.broken;
  forget_keys(it->second);
  peers.erase(it);
  if (ep == nullptr) return answer(*op, success());
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = broken ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return answer(*op, success());
  closing_endpoints.push_back(Closing{request, op, std::nullopt});
}

// ---- shutdown ----

void Backend::Engine::run_shutdown(const std::shared_ptr<VoidOp>& op) {
  if (torn_down) {
    if (op) answer(*op, success());
    return;
  }
  closing = true;
  using clock = std::chrono::steady_clock;

  // Maps registered but not yet answered are undone.
  auto delayed = std::move(delayed_maps);
  delayed_maps.clear();
  for (auto& [id, map] : delayed) {
    if (map->timer) map->timer->cancel();
    release_region(*map->mapped);
    answer(*map, shut_down_error);
  }

  // Transfers in flight get until the deadline to finish.
  const auto deadline = clock::now() + config.shutdown_timeout;
  while (!transfers.empty() && clock::now() < deadline) progress();

  // Endpoints: flushed when healthy and idle, forced otherwise (which also
  // makes UCX fail whatever is still in flight on them).
  const bool force_all = !transfers.empty();
  for (auto& [id, peer] : peers) {
    forget_keys(peer);
    if (peer.ep == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = (force_all || peer.broken) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(peer.ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing_endpoints.push_back(Closing{request, {}, std::nullopt});
  }
  peers.clear();
  const auto close_deadline = clock::now() + config.shutdown_timeout;
  while (!closing_endpoints.empty() && clock::now() < close_deadline) progress();
  for (auto& c : closing_endpoints) {
    if (c.op) answer(*c.op, shut_down_error);
  }
  closing_endpoints.clear();  // the worker's destruction releases them

  // Whatever UCX did not complete is answered now; the worker's destruction
  // ends it.
  for (auto& [id, transfer] : transfers) {
    if (transfer->owns_rkey) ucp_rkey_destroy(transfer->rkey);
    transfer->rkey = nullptr;
    answer(*transfer, shut_down_error);
  }
  in_flight.store(0, std::memory_order_release);

  for (auto it = regions.begin(); it != regions.end();) {
    ucp_mem_unmap(context, it->second.memh);
    for (auto& w : it->second.unmap_waiters) answer(*w, success());
    it = regions.erase(it);
  }
  live.store(0, std::memory_order_release);
  tear_down();
  // Requests still referencing transfer ops died with the worker.
  transfers.clear();
  if (op) answer(*op, success());
}

}  // namespace corma::ucx
