// Puts and the endpoint flushes that complete them: every put issued to a
// peer during one progress turn is completed by a single ucp_ep_flush_nbx
// at the start of the next progress call, so a batch of N puts costs one
// flush, not N.
#include "engine.hpp"

#include <algorithm>

namespace corma::ucx {

void Backend::Engine::record_puts(const std::vector<std::uint64_t>& ids, ucs_status_t status) {
  for (auto id : ids) {
    // An id the table no longer knows is an orphan's or a stranded put's:
    // the finishing loop releases it.
    if (auto* op = find_transfer(id)) op->status = status;
    finished.push_back(id);
  }
}

void Backend::Engine::issue_put(const std::shared_ptr<UcxTransferOp>& op, ucp_ep_h ep, std::byte* local) {
  const auto& req = op->request;
  // No callback: the flush behind it is what answers it.
  const auto posted = post_blocks(ep, true, req, local, op->key->handle());
  if (posted.blocks == 0) return finish_transfer(op->id, posted.status);
  // A strided put cut short still waits for the flush of the blocks it posted.
  op->post_status = posted.status;
  unflushed_puts.emplace_back(req.peer, op->id);
}

void Backend::Engine::flush_puts() {
  if (unflushed_puts.empty()) return;
  // Puts to one peer side by side (usually there is one peer).
  std::sort(unflushed_puts.begin(), unflushed_puts.end());
  for (auto first = unflushed_puts.begin(); first != unflushed_puts.end();) {
    const PeerId peer_id = first->first;
    auto last = std::find_if(first, unflushed_puts.end(), [&](const auto& put) { return put.first != peer_id; });
    std::vector<std::uint64_t> ids;
    ids.reserve(static_cast<std::size_t>(last - first));
    for (auto it = first; it != last; ++it) ids.push_back(it->second);
    first = last;

    auto peer = peers.find(peer_id);
    // Puts are issued only to a peer with an endpoint, and every path that
    // ends one flushes first.
    if (peer == peers.end() || peer->second.ep == nullptr) {
      record_puts(ids, UCS_ERR_CANCELED);
      continue;
    }
    auto& flush = put_flushes.emplace_back(PutFlush{this, std::move(ids), false});
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &Engine::on_put_flush_done;
    param.user_data = &flush;
    ucs_status_ptr_t handle = ucp_ep_flush_nbx(peer->second.ep, &param);
    if (handle == nullptr || UCS_PTR_IS_ERR(handle)) {
      record_puts(flush.puts, handle == nullptr ? UCS_OK : UCS_PTR_STATUS(handle));
      put_flushes.pop_back();
    }
  }
  unflushed_puts.clear();  // keeps its capacity for the next turn
}

void Backend::Engine::on_put_flush_done(void* request, ucs_status_t status, void* user_data) {
  auto* flush = static_cast<PutFlush*>(user_data);
  ucp_request_free(request);
  // Recorded, not finished: we are inside ucp_worker_progress.
  flush->engine->record_puts(flush->puts, status);
  flush->done = true;  // progress() lets the flush go after the worker's turn
}

}  // namespace corma::ucx
