// Puts and the endpoint flushes that complete them: every put issued to a
// peer during one progress turn is completed by a single ucp_ep_flush_nbx
// at the start of the next progress call, so a batch of N puts costs one
// flush, not N.
#include "engine.hpp"

namespace corma::ucx {
namespace {

/// The puts ended with `status`: progress() finishes them (or releases the
/// ones already given up) with the other completions of its turn.
void record(const std::vector<std::shared_ptr<UcxTransferOp>>& puts, ucs_status_t status,
            std::vector<std::uint64_t>& finished) {
  for (const auto& op : puts) {
    op->status = status;
    finished.push_back(op->id);
  }
}

}  // namespace

void Backend::Engine::issue_put(const std::shared_ptr<UcxTransferOp>& op, ucp_ep_h ep, const void* local) {
  const auto& req = op->request;
  // No callback: the flush behind it is what answers it.
  ucp_request_param_t param{};
  ucs_status_ptr_t put = ucp_put_nbx(ep, local, req.len, req.remote_addr, op->key->handle(), &param);
  if (UCS_PTR_IS_ERR(put)) return finish_transfer(op->id, UCS_PTR_STATUS(put));
  if (put != nullptr) ucp_request_free(put);  // UCX releases it when it completes
  unflushed_puts[req.peer].push_back(op);
}

void Backend::Engine::flush_puts() {
  auto by_peer = std::move(unflushed_puts);
  unflushed_puts.clear();
  for (auto& [peer_id, puts] : by_peer) {
    auto peer = peers.find(peer_id);
    // Puts are issued only to a peer with an endpoint, and every path that
    // ends one flushes first.
    if (peer == peers.end() || peer->second.ep == nullptr) {
      record(puts, UCS_ERR_CANCELED, finished);
      continue;
    }
    auto& flush = put_flushes.emplace_back(PutFlush{std::move(puts), &finished, false});
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &Engine::on_put_flush_done;
    param.user_data = &flush;
    ucs_status_ptr_t handle = ucp_ep_flush_nbx(peer->second.ep, &param);
    if (handle == nullptr || UCS_PTR_IS_ERR(handle)) {
      const auto status = handle == nullptr ? UCS_OK : UCS_PTR_STATUS(handle);
      record(flush.puts, status, finished);
      put_flushes.pop_back();
    }
  }
}

void Backend::Engine::on_put_flush_done(void* request, ucs_status_t status, void* user_data) {
  auto* flush = static_cast<PutFlush*>(user_data);
  ucp_request_free(request);
  // Recorded, not finished: we are inside ucp_worker_progress.
  record(flush->puts, status, *flush->finished);
  flush->done = true;  // the ops stay held until progress() lets the flush go
}

}  // namespace corma::ucx
