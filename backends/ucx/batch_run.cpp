// A batch to one peer as one transfer: every element is admitted before any
// is posted (a refused one is answered by its index and never reaches UCX),
// the admitted ones are posted in one loop with no callback and no request
// kept, and one endpoint flush behind them, the only UCX request the batch
// tracks, completes them all. A flush completes after every operation
// issued on the endpoint before it: gets have landed here, puts there.
#include "engine.hpp"

namespace corma::ucx {

using backend_kit::answer;

void Backend::Engine::run_whole_batch(const std::shared_ptr<UcxTransferOp>& op) {
  if (op->cancelled.load(std::memory_order_acquire)) {
    return answer(*op, fail(errc::cancelled, "batch cancelled before it ran"));
  }
  auto peer = initiator_peer(*op);
  if (!peer) return answer(*op, std::move(peer).error());
  admit_run(*op, *peer.value());
  if (op->run_reports == 0) return answer(*op, success());  // every element was refused
  track_run(op);
  peer.value()->wire_up_started = true;
  post_run(*op, peer.value()->ep);
  auto param = callback_param(*op);
  issued(*op, ucp_ep_flush_nbx(peer.value()->ep, &param));
}

void Backend::Engine::admit_run(UcxTransferOp& op, Peer& peer) {
  const bool puts = op.kind == backend_kit::TransferKind::put;
  admitted.clear();
  admitted.reserve(op.run.size());
  LastRegion last_region;
  const TransferKey* last_named = nullptr;
  const RemoteKey* key = nullptr;
  for (std::size_t i = 0; i < op.run.size(); ++i) {
    const auto& req = op.run[i];
    const auto refuse = [&](Error error) {
      refuse_element(op, i, std::move(error));
      admitted.emplace_back();
    };
    auto region = admit_local(req, last_region);
    if (!region) {
      refuse(std::move(region).error());
      continue;
    }
    if (last_named == nullptr || !(*last_named == req.key)) {
      auto found = find_key(req.key, peer);
      if (!found) {
        refuse(std::move(found).error());
        continue;
      }
      key = found.value().get();
      last_named = &req.key;
      // The op holds every key its elements use until UCX is done with them.
      if (!op.key) {
        op.key = std::move(found).value();
      } else if (op.key.get() != key) {
        op.run_keys.push_back(std::move(found).value());
      }
    }
    if (auto inside = validate_remote_range(puts, req, key->addr(), key->len(), key->access()); !inside) {
      refuse(std::move(inside).error());
      continue;
    }
    if (op.run_pins.empty() || op.run_pins.back() != req.local) op.run_pins.push_back(req.local);
    admitted.push_back(AdmittedElement{region.value()->addr + req.local_offset, key->handle()});
  }
}

void Backend::Engine::post_run(UcxTransferOp& op, ucp_ep_h ep) {
  const bool puts = op.kind == backend_kit::TransferKind::put;
  for (std::size_t i = 0; i < op.run.size(); ++i) {
    const auto& element = admitted[i];
    if (element.local == nullptr) continue;
    if (auto posted = post_blocks(ep, puts, op.run[i], element.local, element.rkey); posted.status != UCS_OK) {
      // The rest are not posted; the flush still waits for those that were.
      op.post_status = posted.status;
      return;
    }
  }
}

Backend::Engine::Posted Backend::Engine::post_blocks(ucp_ep_h ep, bool put, const TransferRequest& req,
                                                     std::byte* local, ucp_rkey_h rkey) {
  ucp_request_param_t bare{};  // no callback: a flush behind them answers them
  Posted posted;
  for (; posted.blocks < req.blocks; ++posted.blocks) {
    std::byte* here = local + posted.blocks * req.local_stride;
    const std::uint64_t there = req.remote_addr_of(posted.blocks);
    ucs_status_ptr_t handle =
        put ? ucp_put_nbx(ep, here, req.len, there, rkey, &bare) : ucp_get_nbx(ep, here, req.len, there, rkey, &bare);
    if (UCS_PTR_IS_ERR(handle)) {
      posted.status = UCS_PTR_STATUS(handle);
      return posted;
    }
    if (handle != nullptr) ucp_request_free(handle);  // UCX releases it when it completes
  }
  return posted;
}

}  // namespace corma::ucx
