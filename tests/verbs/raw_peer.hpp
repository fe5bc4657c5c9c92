// A queue pair driven by hand on the software verbs fabric, connected to a
// verbs backend through the seam's offer/answer records: a peer that sends
// whatever bytes a test wants (well-formed or not) and acknowledges nothing
// unless the test does. What the backend sends it is read back byte for byte.
#pragma once

#include "support/soft_verbs.hpp"

#include "wire.hpp"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <vector>

namespace corma::verbs {

class RawPeer {
 public:
  static constexpr std::uint32_t receives = 32;
  static constexpr std::uint32_t slot = 64;

  explicit RawPeer(corma::testing::SoftVerbs& fabric) : fabric_(fabric), api_(fabric.api()), v_(*api_) {
    int n = 0;
    ibv_device** list = v_.get_device_list(&n);
    ctx_ = v_.open_device(list[0]);
    v_.free_device_list(list);
    pd_ = v_.alloc_pd(ctx_);
    cq_ = v_.create_cq(ctx_, 256, nullptr, nullptr, 0);
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = receives;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    qp_ = v_.create_qp(pd_, &init);
    mr_ = v_.reg_mr(pd_, buffer_.data(), buffer_.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    EXPECT_EQ(v_.modify_qp(qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    for (std::uint32_t i = 0; i < receives; ++i) post_receive(i);
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;
  ~RawPeer() {
    v_.destroy_qp(qp_);
    v_.dereg_mr(mr_);
    v_.destroy_cq(cq_);
    v_.dealloc_pd(pd_);
    v_.close_device(ctx_);
  }

  /// This side of the connection, as the backend reads it (an offer or an answer).
  [[nodiscard]] std::vector<std::byte> blob() const {
    ibv_port_attr port{};
    v_.query_port(ctx_, 1, &port);
    wire::QpEndpoint local;
    local.qp_num = qp_->qp_num;
    local.psn = psn;
    local.lid = port.lid;
    local.mtu = 4096;
    return wire::encode_endpoint(local);
  }

  /// Connects to the backend side described by `remote` (INIT→RTR→RTS).
  void connect(const std::vector<std::byte>& remote) {
    auto endpoint = wire::decode_endpoint(remote);
    ASSERT_TRUE(endpoint) << endpoint.error().message();
    ibv_qp_attr rtr{};
    rtr.qp_state = IBV_QPS_RTR;
    rtr.path_mtu = IBV_MTU_4096;
    rtr.dest_qp_num = endpoint.value().qp_num;
    rtr.rq_psn = endpoint.value().psn;
    rtr.max_dest_rd_atomic = 16;
    rtr.min_rnr_timer = 12;
    rtr.ah_attr.port_num = 1;
    rtr.ah_attr.dlid = endpoint.value().lid;
    ASSERT_EQ(v_.modify_qp(qp_, &rtr,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = 14;
    rts.retry_cnt = 7;
    rts.rnr_retry = 7;
    rts.sq_psn = psn;
    rts.max_rd_atomic = 16;
    ASSERT_EQ(v_.modify_qp(qp_, &rts,
                           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                               IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }

  /// Sends `bytes` with `opcode` (a SEND, or an RDMA WRITE with immediate
  /// of no bytes) and waits for its completion: its status.
  ibv_wc_status send(std::span<const std::byte> bytes, ibv_wr_opcode opcode = IBV_WR_SEND, std::uint32_t imm = 0) {
    std::byte* out = buffer_.data() + std::size_t{receives} * slot;
    if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());  // an empty span's data() may be null
    ibv_sge sge{reinterpret_cast<std::uint64_t>(out), static_cast<std::uint32_t>(bytes.size()), mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = ++sent_;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = bytes.empty() ? 0 : 1;
    wr.imm_data = imm;
    ibv_send_wr* bad = nullptr;
    if (v_.post_send(qp_, &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
    std::optional<ibv_wc_status> status;
    fabric_.wait_until(
        [&] {
          drain([&](const ibv_wc& wc) {
            if (wc.wr_id == sent_) status = wc.status;
          });
          return status.has_value();
        },
        std::chrono::seconds(2));
    return status.value_or(IBV_WC_GENERAL_ERR);
  }

  /// The next message the backend sent here, waiting up to `limit`.
  std::optional<std::vector<std::byte>> receive(std::chrono::milliseconds limit = std::chrono::seconds(2)) {
    fabric_.wait_until(
        [&] {
          drain([](const ibv_wc&) {});
          return !inbox_.empty();
        },
        limit);
    if (inbox_.empty()) return std::nullopt;
    auto message = std::move(inbox_.front());
    inbox_.pop_front();
    return message;
  }

  /// Receive completions seen so far (each reposted).
  [[nodiscard]] std::size_t received() const noexcept { return received_; }

  std::uint32_t psn = 0x4321;

 private:
  void post_receive(std::uint32_t i) {
    ibv_sge sge{reinterpret_cast<std::uint64_t>(buffer_.data() + std::size_t{i} * slot), slot, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = receive_bit | i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    EXPECT_EQ(v_.post_recv(qp_, &wr, &bad), 0);
  }

  /// Polls everything: receives go to the inbox (and are reposted), the
  /// rest to `on_send`.
  template <class OnSend>
  void drain(OnSend on_send) {
    std::array<ibv_wc, 8> wcs{};
    for (int n = v_.poll_cq(cq_, 8, wcs.data()); n > 0; n = v_.poll_cq(cq_, 8, wcs.data())) {
      for (int k = 0; k < n; ++k) {
        const ibv_wc& wc = wcs[static_cast<std::size_t>(k)];
        if ((wc.wr_id & receive_bit) == 0) {
          on_send(wc);
          continue;
        }
        if (wc.status != IBV_WC_SUCCESS) continue;
        ++received_;
        const auto i = static_cast<std::uint32_t>(wc.wr_id & ~receive_bit);
        const std::byte* at = buffer_.data() + std::size_t{i} * slot;
        inbox_.emplace_back(at, at + wc.byte_len);
        post_receive(i);
      }
    }
  }

  static constexpr std::uint64_t receive_bit = std::uint64_t{1} << 62;

  corma::testing::SoftVerbs& fabric_;
  std::shared_ptr<const IbvApi> api_;
  const IbvApi& v_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<std::byte> buffer_ = std::vector<std::byte>(std::size_t{receives + 1} * slot);
  std::deque<std::vector<std::byte>> inbox_;
  std::uint64_t sent_ = 0;
  std::size_t received_ = 0;
};

}  // namespace corma::verbs
