// The UCX engine's end: closing its endpoints, settling the worker, and
// destroying it.
//
// Why "settling": UCX 1.13 aborts the whole process (an assertion in
// ucp_request_send_state_ff, "got REP message") when it purges a wire-up
// reply still queued on a tcp endpoint, which it does when it destroys the
// worker holding that endpoint, or fails the endpoint because the peer's
// worker went away. Such a reply is queued by the target of an endpoint's
// wire-up: the initiator's first transfer asks for the target's endpoint
// id; the target makes an endpoint of its own (one we hold no handle to)
// and its reply waits until the initiator has taken in the target's request
// to use their connection both ways, which needs a turn of the initiator's
// progress. UCX says nothing of that reply (a worker flush does not wait for
// it), so the backend keeps its worker progressing until its peers fall
// quiet before destroying it:
//   - a backend with readers (accepted peers) serves them until they have
//     been silent for a moment, so a reader that was busy when the shutdown
//     began takes in the reply, and its gets still in flight complete
//     instead of waiting for the reader's own shutdown timeout;
//   - a backend that closed an endpoint whose wire-up had not finished does
//     the same, so that the target's reply reaches a worker still alive.
// Both are bounded by the shutdown timeout. Nothing UCX offers can end a
// peer's wire-up early: a peer silent for longer mid-wire-up still aborts.
#include "engine.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace corma::ucx {
namespace {

using backend_kit::answer;

}  // namespace

void Backend::Engine::note_endpoint_closing(const Peer& peer) {
  if (peer.wire_up_started && !peer.wired && !peer.failed) replies_owed = true;
}

void Backend::Engine::close_peers() {
  flush_puts();
  // Endpoints: flushed when healthy and idle, forced otherwise (which also
  // makes UCX fail whatever is still in flight on them).
  const bool force_all = has_transfers();
  const bool readers = std::any_of(peers.begin(), peers.end(), [](const auto& p) { return p.second.reader; });
  for (auto& [id, peer] : peers) {
    const bool force = force_all || peer.broken;
    if (force && !can_force_close()) {
      // The worker's destruction ends the endpoint and the transfers on
      // it; each holds its key until then.
      forget_keys(peer);
      continue;
    }
    forget_keys(peer);
    if (peer.ep == nullptr) continue;
    note_endpoint_closing(peer);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(peer.ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing_endpoints.push_back(Closing{request, {}, std::nullopt});
  }
  peers.clear();
  progress_until([this] { return closing_endpoints.empty(); });
  for (auto& c : closing_endpoints) {
    if (c.op) answer(*c.op, shut_down_error());
    // Released unfinished (a flush towards a peer that died before the
    // endpoint's wire-up completed never ends): the worker's destruction
    // then ends it. UCX aborts on a request still held when it does.
    if (c.request != nullptr) ucp_request_free(c.request);
  }
  closing_endpoints.clear();
  settle_worker(readers || replies_owed);
}

void Backend::Engine::settle_worker(bool listen) {
  using clock = std::chrono::steady_clock;
  if (!listen) return;
  // How long the peers must stay silent before they count as done: long
  // enough for a busy or descheduled peer to take in a target's reply (or
  // send its next request), a small part of the shutdown timeout.
  const auto quiet = std::clamp<std::chrono::milliseconds>(settings.shutdown_timeout / 20, std::chrono::milliseconds(10),
                                                           std::chrono::milliseconds(250));
  const auto deadline = clock::now() + settings.shutdown_timeout;
  auto last_event = clock::now();
  for (;;) {
    const auto now = clock::now();
    if (progress() != 0) {
      last_event = now;
      continue;
    }
    const auto until = std::min(last_event + quiet, deadline);
    if (now >= until) return;
    // Asleep, not spinning: a peer sharing this machine's cores gets them.
    const int accepting_fd = accepting.arm_for_poll();
    if (accepting_fd < 0) continue;
    pollfd ready[2] = {{accepting_fd, POLLIN, 0}, {connecting.arm_for_poll(), POLLIN, 0}};
    if (connecting.is_open() && ready[1].fd < 0) continue;  // events pending there
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
    (void)::poll(ready, connecting.is_open() ? 2 : 1, static_cast<int>(std::max<std::int64_t>(left.count(), 1)));
  }
}

void Backend::Engine::tear_down() {
  stop_deadline_sweep();
  accepting.close_wake();
  connecting.close_wake();
  // Every key goes before the worker (they come from its pools): those of
  // peers, of stranded transfers and of transfers never answered; nothing
  // progresses the worker any more, so no request uses them.
  for (auto& [id, peer] : peers) forget_keys(peer);
  for (auto& [id, op] : orphans) forget_transfer(*op);
  for (auto& [id, op] : stranded) forget_transfer(*op);
  for (auto id : transfers_where([](const UcxTransferOp&) { return true; })) {
    if (auto op = share_transfer(id)) forget_transfer(*op);
  }
  // Destroying the worker ends every endpoint and request it still held.
  // Acknowledgements still sending end with the worker; their bytes go after.
  for (auto& ack : pending_acks) ucp_request_free(ack.request);
  connecting.destroy();
  accepting.destroy();
  pending_acks.clear();
  if (context != nullptr) ucp_cleanup(context);
  orphans.clear();  // no callback can reach them any more
  stranded.clear();
  put_flushes.clear();
  context = nullptr;
  mark_torn_down();
}

}  // namespace corma::ucx
