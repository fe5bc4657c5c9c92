// SoftVerbs: an in-process software verbs provider for tests. It fills the
// verbs backend's function table (corma::verbs::IbvApi) with an
// implementation that behaves like an RC-capable device on one shared fabric:
// devices, contexts, PDs, MRs with lkey/rkey, completion channels, CQs and RC
// QPs whose RDMA READ/WRITE, SEND, immediate-data and 64-bit atomic
// (fetch-and-add, compare-and-swap) work requests execute asynchronously on
// the provider's own thread, with the checks real hardware makes (state
// machine, keys, bounds, access flags, atomic alignment, send- and
// receive-queue depth, message size, receive buffer length).
// Faults and timing are injectable, and counters expose what the caller did,
// so that a backend bug shows up as a failed test rather than as silent
// success.
//
// The fabric is process-wide (C function pointers cannot carry state): every
// backend in the process that uses api() is a host on the same fabric, and a
// QP of one can connect to a QP of another. Each context is a port of its own
// (its own LID), so two backends on "soft0" are two hosts.
//
// Rules a caller meets here as on hardware:
// - A send-queue slot is freed only when the completion of its work request,
//   or of a later one on the same QP, has been polled; unsignaled successes
//   produce no completion. post_send beyond cap.max_send_wr fails (ENOMEM).
// - req_notify_cq notifies for the next completion added after arming, not
//   for entries already queued: poll again after arming.
// - ibv_qp::state follows modify_qp only; an error completion moves the QP to
//   the error state without touching that field.
// - A request is answered only by the QP its dest_qp_num names, if that QP is
//   in RTR or RTS, names this QP back, expects this QP's sq_psn as its rq_psn
//   and (InfiniBand) sits behind the dlid used. Until then the request is
//   retried (later requests of its QP wait behind it) for the QP's retry
//   window, 4.096 us * 2^timeout * (retry_cnt + 1), forever with timeout 0;
//   then it completes with IBV_WC_RETRY_EXC_ERR. So a peer may post as soon
//   as it is in RTS, before the other side has reached RTR, as on hardware.
// - A responder that rejects a request (remote access error, or an operation
//   its QP's access flags do not allow) enters the error state too and
//   raises IBV_EVENT_QP_ACCESS_ERR or IBV_EVENT_QP_REQ_ERR on its context.
// - SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM take the responder's oldest
//   posted receive (post_recv, allowed from INIT on; at most
//   cap.max_recv_wr), in order with the QP's other work: the receive
//   completes (IBV_WC_RECV, or IBV_WC_RECV_RDMA_WITH_IMM for the write, with
//   byte_len, src_qp, and IBV_WC_WITH_IMM and imm_data when immediate data
//   came) after every earlier request of that QP executed. A SEND lands in
//   the receive's buffer; a longer one fails the receive (IBV_WC_LOC_LEN_ERR)
//   and the request (IBV_WC_REM_INV_REQ_ERR), and both QPs stop. With no
//   receive posted the responder answers RNR NAKs: the request (and those of
//   its QP behind it) waits the responder's min_rnr_timer rnr_retry times,
//   then fails with IBV_WC_RNR_RETRY_EXC_ERR; rnr_retry 7 waits for a receive
//   forever, as the spec says. A QP entering the error state flushes its
//   posted receives (IBV_WC_WR_FLUSH_ERR) onto its receive CQ.
// - An atomic's single scatter/gather entry is the 8-byte local buffer its
//   old value lands in (any other length: IBV_WC_LOC_LEN_ERR). A misaligned
//   remote word is an invalid request (IBV_WC_REM_INV_REQ_ERR); an MR without
//   IBV_ACCESS_REMOTE_ATOMIC, or a word outside it, a remote access error
//   (IBV_WC_REM_ACCESS_ERR). Atomics are atomic with respect to one another
//   and to the provider's own RDMA reads and writes of the word (all execute
//   under one lock), and to host code using std::atomic_ref on it.
// - destroy_cq and destroy_qp fail with EBUSY while events read for them are
//   unacknowledged (libibverbs would block forever); close_device, dealloc_pd
//   and destroy_comp_channel fail with EBUSY while objects depend on them.
#pragma once

#include "ibv_api.hpp"

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace corma::testing {

/// One IB-type GID (fe80::/64 link-local, like an IB port's GID 0).
[[nodiscard]] std::vector<std::pair<ibv_gid, ibv_gid_type>> default_soft_gids();

struct SoftVerbsConfig {
  /// Port attribute; a work request longer than this completes with IBV_WC_LOC_LEN_ERR.
  std::uint32_t max_msg_sz = 1U << 20;
  /// Device cap; create_qp asking for more send or receive WRs fails with EINVAL.
  std::uint32_t max_qp_wr = 256;
  /// Device cap; create_cq asking for more fails with EINVAL.
  int max_cqe = 4096;
  /// IBV_LINK_LAYER_INFINIBAND (LIDs route) or IBV_LINK_LAYER_ETHERNET (RoCE:
  /// lid 0, the address vector must carry a GRH whose dgid is in the table).
  std::uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  /// The port's GID table, shared by every context. An all-zero GID is an
  /// unpopulated slot (query_gid gives zeros, query_gid_ex ENODATA).
  std::vector<std::pair<ibv_gid, ibv_gid_type>> gids = default_soft_gids();
  /// 0: get_device_list returns an empty (non-null) list.
  std::uint32_t device_count = 1;
  /// get_device_list returns NULL with errno = ENOSYS (a kernel without RDMA).
  bool no_kernel_support = false;
  /// Device attribute. IBV_ATOMIC_NONE: post_send refuses atomic work
  /// requests (EINVAL), as a device without atomics does.
  ibv_atomic_cap atomic_cap = IBV_ATOMIC_HCA;
};

class SoftVerbs {
 public:
  /// The fabric. Never destroyed (its worker thread runs until the process exits).
  static SoftVerbs& instance();

  SoftVerbs(const SoftVerbs&) = delete;
  SoftVerbs& operator=(const SoftVerbs&) = delete;

  /// The function table; origin "soft". Every entry is filled.
  [[nodiscard]] std::shared_ptr<const verbs::IbvApi> api() const;

  /// Installs `config`, clears faults, counters, hold and delay, and starts a
  /// new generation. Call between tests. Objects left from earlier
  /// generations stay valid, so a backend still shutting down can finish
  /// cleanly, but no longer count (live_*(), counters) or receive faults and
  /// raised events; their QPs enter the error state, so their queued and
  /// later work flushes without touching memory.
  void reset(const SoftVerbsConfig& config = {});

  // ---- Faults ------------------------------------------------------------
  /// The next reg_mr / reg_mr_iova2 returns NULL with errno = err.
  void fail_next_reg_mr(int err);
  /// The next work request the worker executes completes with `status`
  /// without moving data; like any error completion this moves its QP to the
  /// error state, so its later and queued work requests flush. The responder
  /// is not affected.
  void fail_next_completion(ibv_wc_status status);
  /// Every QP of this generation moves to the error state: its queued work flushes
  /// (IBV_WC_WR_FLUSH_ERR) and IBV_EVENT_QP_FATAL is raised for it on its context.
  void move_qps_to_error();
  /// Raises `type` on every context of this generation: QP events once per QP of that
  /// context (element.qp), IBV_EVENT_CQ_ERR once per CQ (element.cq), port
  /// events with element.port_num = 1, device events with element zeroed.
  /// SRQ and WQ events raise nothing (there are no SRQs or WQs).
  void raise_async_event(ibv_event_type type);
  /// Work requests are accepted but not executed until release_work().
  void hold_work();
  void release_work();
  /// The worker waits this long before executing each work request.
  void set_work_delay(std::chrono::nanoseconds delay);

  // ---- Observations ------------------------------------------------------
  /// Work requests accepted by post_send since reset.
  [[nodiscard]] std::size_t work_requests_posted() const;
  /// post_send calls that accepted at least one work request, since reset.
  [[nodiscard]] std::size_t post_send_calls() const;
  /// The highest send-queue occupancy seen on any one QP. A slot is taken by
  /// post_send and freed, as on hardware, when the completion of that work
  /// request or of a later one on the same QP has been polled.
  [[nodiscard]] std::size_t max_outstanding() const;
  /// post_send calls refused (ENOMEM) because the send queue was full.
  [[nodiscard]] std::size_t overruns() const;
  /// Receives accepted by post_recv since reset.
  [[nodiscard]] std::size_t receives_posted() const;
  /// SENDs and RDMA WRITEs with immediate that found no receive posted at
  /// their responder (an RNR NAK), each counted once, since reset. A caller
  /// with a working credit scheme leaves it at 0.
  [[nodiscard]] std::size_t rnr_naks() const;
  /// Completions lost because the CQ was full (each also raises IBV_EVENT_CQ_ERR).
  [[nodiscard]] std::size_t cq_overruns() const;
  /// Caller mistakes: calls naming a null, unknown or already destroyed
  /// object, device lists freed twice, more events acknowledged than were
  /// read, and fds the provider owns (a channel's fd, async_fd) closed by the
  /// caller. A correct caller leaves it at 0.
  [[nodiscard]] std::size_t misuses() const;
  /// What the latest misuse was (call and reason), empty if none since reset.
  [[nodiscard]] std::string last_misuse() const;
  [[nodiscard]] std::size_t live_mrs() const;
  [[nodiscard]] std::size_t live_qps() const;
  [[nodiscard]] std::size_t live_pds() const;
  [[nodiscard]] std::size_t live_cqs() const;
  [[nodiscard]] std::size_t live_comp_channels() const;
  [[nodiscard]] std::size_t open_contexts() const;
  [[nodiscard]] std::size_t live_device_lists() const;
  /// Work requests accepted and not yet executed: held, delayed, queued, or
  /// retried while their responder does not answer.
  [[nodiscard]] std::size_t work_requests_executing_or_queued() const;
  /// Completion events read by get_cq_event and not yet acknowledged (live CQs).
  [[nodiscard]] std::size_t unacked_cq_events() const;
  /// Async events read by get_async_event and not yet acknowledged.
  [[nodiscard]] std::size_t unacked_async_events() const;

  /// The rkey of a live MR whose host range covers `addr` (any one, if several
  /// do): for tests that play a peer forging a key it was never given.
  [[nodiscard]] std::optional<std::uint32_t> rkey_of(const void* addr) const;
  /// The provider objects still alive ("2 qps, 1 mrs", ...); empty when
  /// everything was destroyed.
  [[nodiscard]] std::string leftovers() const;

  /// Evaluates `pred` (on the calling thread, without the provider's lock
  /// held) whenever the provider's state changes, at least every millisecond,
  /// until it holds or `timeout` passes. Returns its last value.
  bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) const;

 private:
  SoftVerbs() = default;
};

}  // namespace corma::testing
