// The software verbs provider (tests/support/soft_verbs.*), exercised
// directly through its function table: the checks it makes are the ones the
// verbs backend's tests rely on to catch backend bugs.
#include "support/soft_verbs.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using corma::testing::SoftVerbsConfig;
using Provider = corma::testing::SoftVerbs;
using namespace std::chrono_literals;

constexpr int kRemoteAccess = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
constexpr int kFullAccess = IBV_ACCESS_LOCAL_WRITE | kRemoteAccess;
constexpr int kAtomicQpAccess = kRemoteAccess | IBV_ACCESS_REMOTE_ATOMIC;
constexpr int kAtomicRegion = kFullAccess | IBV_ACCESS_REMOTE_ATOMIC;

/// One host's objects: a context with a PD, a channel, a CQ and an RC QP.
struct Endpoint {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<ibv_mr*> mrs;
};

/// An RDMA work request with its one scatter/gather entry.
class WorkRequest {
 public:
  WorkRequest(ibv_wr_opcode opcode, const void* local, const ibv_mr* mr, std::uint32_t length,
              const void* remote, std::uint32_t rkey, std::uint64_t wr_id) {
    sge_.addr = reinterpret_cast<std::uintptr_t>(local);
    sge_.length = length;
    sge_.lkey = mr != nullptr ? mr->lkey : 0;
    wr_.wr_id = wr_id;
    wr_.opcode = opcode;
    wr_.send_flags = IBV_SEND_SIGNALED;
    wr_.sg_list = &sge_;
    wr_.num_sge = 1;
    wr_.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(remote);
    wr_.wr.rdma.rkey = rkey;
  }
  /// An atomic on the word at `remote`; its old value lands in `result`.
  WorkRequest(ibv_wr_opcode opcode, std::uint64_t* result, const ibv_mr* mr, const void* remote, std::uint32_t rkey,
              std::uint64_t compare_add, std::uint64_t swap, std::uint64_t wr_id)
      : WorkRequest(opcode, result, mr, sizeof *result, nullptr, 0, wr_id) {
    // The union lays an atomic's fields out differently from an RDMA's.
    wr_.wr.atomic.remote_addr = reinterpret_cast<std::uintptr_t>(remote);
    wr_.wr.atomic.compare_add = compare_add;
    wr_.wr.atomic.swap = swap;
    wr_.wr.atomic.rkey = rkey;
  }
  WorkRequest(const WorkRequest&) = delete;
  WorkRequest& operator=(const WorkRequest&) = delete;

  ibv_send_wr* get() { return &wr_; }
  WorkRequest& unsignaled() {
    wr_.send_flags = 0;
    return *this;
  }
  WorkRequest& without_sge() {
    wr_.num_sge = 0;
    wr_.sg_list = nullptr;
    return *this;
  }
  /// Immediate data, for the *_WITH_IMM opcodes.
  WorkRequest& with_immediate(std::uint32_t imm) {
    wr_.imm_data = imm;
    return *this;
  }
  /// Chains `next` after this request and returns it, so that a longer
  /// chain reads in post order: a.then(b).then(c).
  WorkRequest& then(WorkRequest& next) {
    wr_.next = next.get();
    return next;
  }

 private:
  ibv_sge sge_{};
  ibv_send_wr wr_{};
};

std::uint32_t psn_of(const ibv_qp* qp) { return (qp->qp_num * 2654435761U) & 0xffffff; }

/// The 8 bytes a link registers on each side.
using Region = std::array<char, 8>;

/// How a test's link differs from the default one.
struct LinkOptions {
  std::uint32_t max_send_wr = 16;           // a's send queue
  int cqe = 64;                             // a's CQ
  int responder_qp_access = kRemoteAccess;  // what b's QP allows a to do
  Region local_bytes{};                     // what a's region holds at first
  Region remote_bytes{};                    // and b's
  int remote_region_access = kFullAccess;
};

/// Two endpoints with an 8-byte region registered on each: `a` sends the
/// requests, `b` answers them. Most transfer tests need no more.
struct Link {
  Link(Endpoint& requester, Endpoint& responder) : a(requester), b(responder) {}
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  /// a writes its region into b's.
  WorkRequest write(std::uint64_t wr_id) const {
    return {IBV_WR_RDMA_WRITE, local.data(), lmr, 8, remote.data(), rmr->rkey, wr_id};
  }
  /// a reads b's region into its own.
  WorkRequest read(std::uint64_t wr_id) const {
    return {IBV_WR_RDMA_READ, local.data(), lmr, 8, remote.data(), rmr->rkey, wr_id};
  }
  /// b writes its region into a's: a request the other way.
  WorkRequest reply(std::uint64_t wr_id) const {
    return {IBV_WR_RDMA_WRITE, remote.data(), rmr, 8, local.data(), lmr->rkey, wr_id};
  }

  Endpoint& a;
  Endpoint& b;
  Region local{};   // registered on a
  Region remote{};  // registered on b
  ibv_mr* lmr = nullptr;
  ibv_mr* rmr = nullptr;
};

/// Two endpoints whose QPs are connected to each other.
struct Pair {
  Endpoint& a;
  Endpoint& b;
};

class SoftVerbs : public ::testing::Test {
 protected:
  void SetUp() override { provider.reset(); }

  void TearDown() override {
    release_endpoints();
    EXPECT_EQ(provider.leftovers(), "") << "objects left alive";
    EXPECT_EQ(provider.misuses(), expected_misuses);
  }

  /// Destroys every endpoint's objects in dependency order.
  void release_endpoints() {
    const auto expect_done = [](int rc, const char* what) { EXPECT_EQ(rc, 0) << what; };
    for (auto& e : endpoints) {
      if (e.qp != nullptr) expect_done(v.destroy_qp(e.qp), "destroy_qp");
      for (auto* mr : e.mrs) expect_done(v.dereg_mr(mr), "dereg_mr");
      if (e.cq != nullptr) expect_done(v.destroy_cq(e.cq), "destroy_cq");
      if (e.channel != nullptr) expect_done(v.destroy_comp_channel(e.channel), "destroy_comp_channel");
      if (e.pd != nullptr) expect_done(v.dealloc_pd(e.pd), "dealloc_pd");
      if (e.ctx != nullptr) expect_done(v.close_device(e.ctx), "close_device");
    }
    links.clear();
    endpoints.clear();
  }

  ibv_context* open_context() {
    int n = 0;
    ibv_device** list = v.get_device_list(&n);
    EXPECT_NE(list, nullptr);
    if (list == nullptr || n < 1) return nullptr;
    ibv_context* ctx = v.open_device(list[0]);
    v.free_device_list(list);
    EXPECT_NE(ctx, nullptr);
    return ctx;
  }

  /// An endpoint with a context only, for tests that create the rest themselves.
  Endpoint& bare_endpoint() {
    Endpoint& e = endpoints.emplace_back();
    e.ctx = open_context();
    return e;
  }

  /// A fresh endpoint on its own context; torn down by TearDown.
  Endpoint& endpoint(std::uint32_t max_send_wr = 16, int cqe = 64, std::uint32_t max_recv_wr = 4) {
    Endpoint& e = endpoints.emplace_back();
    e.ctx = open_context();
    e.pd = v.alloc_pd(e.ctx);
    e.channel = v.create_comp_channel(e.ctx);
    e.cq = v.create_cq(e.ctx, cqe, &e, e.channel, 0);
    ibv_qp_init_attr init{};
    init.send_cq = e.cq;
    init.recv_cq = e.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = max_send_wr;
    init.cap.max_recv_wr = max_recv_wr;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    e.qp = v.create_qp(e.pd, &init);
    EXPECT_NE(e.qp, nullptr);
    return e;
  }

  ibv_mr* reg(Endpoint& e, void* addr, std::size_t length, int access = kFullAccess) {
    ibv_mr* mr = v.reg_mr(e.pd, addr, length, access);
    if (mr != nullptr) e.mrs.push_back(mr);
    return mr;
  }

  int to_init(Endpoint& e, int access = kRemoteAccess) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = static_cast<unsigned>(access);
    return v.modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }

  /// INIT→RTR attributes that address `remote` (by LID, or by GID 0 on RoCE).
  ibv_qp_attr rtr_attributes(const Endpoint& remote) {
    ibv_port_attr port{};
    EXPECT_EQ(v.query_port(remote.ctx, 1, &port), 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = remote.qp->qp_num;
    a.rq_psn = psn_of(remote.qp);
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = 1;
    a.ah_attr.dlid = port.lid;
    if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.sgid_index = 0;
      a.ah_attr.grh.hop_limit = 64;
      EXPECT_EQ(v.query_gid(remote.ctx, 1, 0, &a.ah_attr.grh.dgid), 0);
    }
    return a;
  }
  static constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

  int to_rtr(Endpoint& e, const Endpoint& remote) {
    ibv_qp_attr a = rtr_attributes(remote);
    return v.modify_qp(e.qp, &a, kRtrMask);
  }

  int to_rts(Endpoint& e) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = rts_timeout;
    a.retry_cnt = 7;
    a.rnr_retry = rts_rnr_retry;
    a.sq_psn = psn_of(e.qp);
    a.max_rd_atomic = 16;
    return v.modify_qp(e.qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
  }

  /// Connects two QPs (possibly on different contexts) through RESET→INIT→RTR→RTS.
  void connect(Endpoint& a, Endpoint& b, int a_access = kRemoteAccess, int b_access = kRemoteAccess) {
    ASSERT_EQ(to_init(a, a_access), 0);
    ASSERT_EQ(to_init(b, b_access), 0);
    ASSERT_EQ(to_rtr(a, b), 0);
    ASSERT_EQ(to_rtr(b, a), 0);
    ASSERT_EQ(to_rts(a), 0);
    ASSERT_EQ(to_rts(b), 0);
  }

  /// Two fresh endpoints, `a` with the given queue sizes, connected.
  Pair connected_pair(const LinkOptions& options = {}) {
    Endpoint& a = endpoint(options.max_send_wr, options.cqe);
    Endpoint& b = endpoint();
    connect(a, b, kRemoteAccess, options.responder_qp_access);
    return {a, b};
  }

  /// Registers a link's regions on `a` and `b`, however their QPs are connected.
  Link& link_between(Endpoint& a, Endpoint& b, const LinkOptions& options = {}) {
    Link& l = links.emplace_back(a, b);
    l.local = options.local_bytes;
    l.remote = options.remote_bytes;
    l.lmr = reg(a, l.local.data(), l.local.size());
    l.rmr = reg(b, l.remote.data(), l.remote.size(), options.remote_region_access);
    return l;
  }

  /// A link over a freshly connected pair.
  Link& link(const LinkOptions& options = {}) {
    auto [a, b] = connected_pair(options);
    return link_between(a, b, options);
  }

  /// Moves `e`'s QP to `state` with the state alone (RESET and ERR need nothing else).
  int set_state(Endpoint& e, ibv_qp_state state) {
    ibv_qp_attr a{};
    a.qp_state = state;
    return v.modify_qp(e.qp, &a, IBV_QP_STATE);
  }

  /// Keeps `e`'s send queue `depth` deep until `wanted` work requests made by
  /// `make(n)` completed well (or 5 s passed), polling to make room; how
  /// many did.
  template <class Make>
  std::uint64_t keep_queue_full(Endpoint& e, std::uint32_t depth, std::uint64_t wanted, Make make) {
    std::uint64_t posted = 0, in_flight = 0, good = 0;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (good < wanted && std::chrono::steady_clock::now() < deadline) {
      while (posted < wanted && in_flight < depth) {
        WorkRequest wr = make(posted);
        if (post(e, wr) != 0) return good;
        ++posted;
        ++in_flight;
      }
      std::array<ibv_wc, 4> wc{};
      const int n = v.poll_cq(e.cq, static_cast<int>(wc.size()), wc.data());
      for (int k = 0; k < n; ++k) {
        if (wc[static_cast<std::size_t>(k)].status == IBV_WC_SUCCESS) ++good;
      }
      in_flight -= static_cast<std::uint64_t>(std::max(n, 0));
    }
    return good;
  }

  /// Posts one receive of `length` bytes at `buffer` (registered as `mr`).
  int post_receive(Endpoint& e, void* buffer, std::uint32_t length, const ibv_mr* mr, std::uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer), length, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return v.post_recv(e.qp, &wr, &bad);
  }

  int post(Endpoint& e, WorkRequest& wr, ibv_send_wr** bad = nullptr) {
    ibv_send_wr* ignored = nullptr;
    return v.post_send(e.qp, wr.get(), bad != nullptr ? bad : &ignored);
  }

  /// Polls until `n` completions arrived or a second passed.
  std::vector<ibv_wc> poll(Endpoint& e, std::size_t n) {
    std::vector<ibv_wc> got;
    provider.wait_until(
        [&] {
          std::array<ibv_wc, 8> wc{};
          const int k = v.poll_cq(e.cq, static_cast<int>(wc.size()), wc.data());
          EXPECT_GE(k, 0);
          for (int i = 0; i < k; ++i) got.push_back(wc[static_cast<std::size_t>(i)]);
          return got.size() >= n;
        },
        1000ms);
    return got;
  }

  /// Posts `wr` on `e` and polls for `n` completions; none when the post is refused.
  std::vector<ibv_wc> post_and_poll(Endpoint& e, WorkRequest& wr, std::size_t n) {
    const int rc = post(e, wr);
    EXPECT_EQ(rc, 0);
    if (rc != 0) return {};
    return poll(e, n);
  }

  /// Polls once, without waiting: how many completions were there (0 or 1).
  int poll_once(Endpoint& e) {
    ibv_wc wc{};
    return v.poll_cq(e.cq, 1, &wc);
  }

  /// Waits for the next completion of `e` and checks its status.
  void expect_completion(Endpoint& e, ibv_wc_status status) {
    const auto wc = poll(e, 1);
    ASSERT_EQ(wc.size(), 1U);
    EXPECT_EQ(wc[0].status, status);
  }

  /// Posts `wr` on `e` and checks the status it completes with.
  void expect_completes(Endpoint& e, WorkRequest wr, ibv_wc_status status) {
    ASSERT_EQ(post(e, wr), 0);
    expect_completion(e, status);
  }

  /// Waits until the provider executed everything it accepted.
  bool drained() {
    return provider.wait_until([&] { return provider.work_requests_executing_or_queued() == 0; }, 1000ms);
  }

  static bool readable(int fd, std::chrono::milliseconds timeout) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 && (p.revents & POLLIN) != 0;
  }

  static void make_nonblocking(int fd) {
    ASSERT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
  }

  /// Reads the next async event of `ctx`, waiting up to a second for it.
  bool next_async_event(ibv_context* ctx, ibv_async_event& event) {
    return readable(ctx->async_fd, 1000ms) && v.get_async_event(ctx, &event) == 0;
  }

  /// Reads the next async event of `e`, checks that it is `type` about e's
  /// QP, and acknowledges it.
  void expect_qp_event(Endpoint& e, ibv_event_type type) {
    ibv_async_event event{};
    ASSERT_TRUE(next_async_event(e.ctx, event));
    EXPECT_EQ(event.event_type, type);
    EXPECT_EQ(event.element.qp, e.qp);
    v.ack_async_event(&event);
  }

  Provider& provider = Provider::instance();
  std::shared_ptr<const corma::verbs::IbvApi> api = provider.api();
  const corma::verbs::IbvApi& v = *api;
  std::deque<Endpoint> endpoints;
  std::deque<Link> links;
  std::size_t expected_misuses = 0;
  /// The local ACK timeout to_rts sets: 14 (67 ms per try) as a real
  /// deployment would; tests of unanswered requests shorten it.
  std::uint8_t rts_timeout = 14;
  /// The RNR retry count to_rts sets: 7 (wait for a receive forever), as
  /// the verbs backend does; tests of RNR errors lower it.
  std::uint8_t rts_rnr_retry = 7;
};

// ---- Devices and queries ----------------------------------------------------

TEST_F(SoftVerbs, DeviceListNamesEveryConfiguredDevice) {
  SoftVerbsConfig config;
  config.device_count = 2;
  provider.reset(config);
  EXPECT_EQ(v.origin, "soft");
  int n = -1;
  ibv_device** list = v.get_device_list(&n);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(n, 2);
  EXPECT_STREQ(v.get_device_name(list[0]), "soft0");
  EXPECT_STREQ(v.get_device_name(list[1]), "soft1");
  EXPECT_EQ(list[2], nullptr);
  EXPECT_EQ(provider.live_device_lists(), 1U);
  v.free_device_list(list);
}

TEST_F(SoftVerbs, KernelWithoutRdmaGivesNoListAndEnosys) {
  SoftVerbsConfig config;
  config.no_kernel_support = true;
  provider.reset(config);
  errno = 0;
  int n = -1;
  EXPECT_EQ(v.get_device_list(&n), nullptr);
  EXPECT_EQ(errno, ENOSYS);
}

TEST_F(SoftVerbs, NoDeviceGivesAnEmptyList) {
  SoftVerbsConfig config;
  config.device_count = 0;
  provider.reset(config);
  int n = -1;
  ibv_device** list = v.get_device_list(&n);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(n, 0);
  EXPECT_EQ(list[0], nullptr);
  v.free_device_list(list);
}

TEST_F(SoftVerbs, DeviceAndPortQueriesDescribeTheConfiguration) {
  SoftVerbsConfig config;
  config.max_qp_wr = 128;
  config.max_msg_sz = 8192;
  provider.reset(config);
  Endpoint& a = bare_endpoint();
  Endpoint& b = bare_endpoint();
  ASSERT_NE(b.ctx, nullptr);
  EXPECT_GE(a.ctx->async_fd, 0);

  ibv_device_attr dev{};
  ASSERT_EQ(v.query_device(a.ctx, &dev), 0);
  EXPECT_EQ(dev.max_qp_wr, 128);
  EXPECT_EQ(dev.max_qp_rd_atom, 16);
  EXPECT_EQ(dev.atomic_cap, IBV_ATOMIC_HCA);
  EXPECT_EQ(dev.max_sge, 1);
  EXPECT_EQ(dev.phys_port_cnt, 1);

  ibv_port_attr pa{}, pb{};
  ASSERT_EQ(v.query_port(a.ctx, 1, &pa), 0);
  ASSERT_EQ(v.query_port(b.ctx, 1, &pb), 0);
  EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(pa.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(pa.max_msg_sz, 8192U);
  EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_EQ(pa.gid_tbl_len, 1);
  EXPECT_NE(pa.lid, 0);
  EXPECT_NE(pa.lid, pb.lid);  // each context is a port of its own
  EXPECT_EQ(v.query_port(a.ctx, 2, &pa), EINVAL);

  ibv_gid gid{};
  ASSERT_EQ(v.query_gid(a.ctx, 1, 0, &gid), 0);
  EXPECT_EQ(std::memcmp(&gid, &config.gids[0].first, sizeof gid), 0);
  errno = 0;
  EXPECT_EQ(v.query_gid(a.ctx, 1, 1, &gid), -1);
  EXPECT_EQ(errno, EINVAL);

  ibv_gid_entry entry{};
  ASSERT_EQ(v.query_gid_ex(a.ctx, 1, 0, &entry, 0, sizeof entry), 0);
  EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_IB);
  EXPECT_EQ(entry.gid_index, 0U);
  EXPECT_EQ(v.query_gid_ex(a.ctx, 1, 0, &entry, 0, sizeof entry - 1), EINVAL);
  EXPECT_EQ(v.query_gid_ex(a.ctx, 1, 1, &entry, 0, sizeof entry), EINVAL);
}

TEST_F(SoftVerbs, RoceHasNoLidAndConnectsByGid) {
  SoftVerbsConfig config;
  config.link_layer = IBV_LINK_LAYER_ETHERNET;
  ibv_gid v1{}, v2{};
  v1.raw[0] = 0xfe;
  v1.raw[1] = 0x80;
  v1.raw[15] = 1;
  v2.raw[10] = 0xff;  // ::ffff:10.0.0.7
  v2.raw[11] = 0xff;
  v2.raw[12] = 10;
  v2.raw[15] = 7;
  config.gids = {{v1, IBV_GID_TYPE_ROCE_V1}, {ibv_gid{}, IBV_GID_TYPE_ROCE_V2}, {v2, IBV_GID_TYPE_ROCE_V2}};
  provider.reset(config);
  Endpoint& a = endpoint();
  Endpoint& b = endpoint();

  ibv_port_attr port{};
  ASSERT_EQ(v.query_port(a.ctx, 1, &port), 0);
  EXPECT_EQ(port.lid, 0);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(port.gid_tbl_len, 3);
  ibv_gid_entry entry{};
  ASSERT_EQ(v.query_gid_ex(a.ctx, 1, 0, &entry, 0, sizeof entry), 0);
  EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_ROCE_V1);
  EXPECT_EQ(v.query_gid_ex(a.ctx, 1, 1, &entry, 0, sizeof entry), ENODATA);
  ASSERT_EQ(v.query_gid_ex(a.ctx, 1, 2, &entry, 0, sizeof entry), 0);
  EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
  ibv_gid empty{};
  empty.raw[0] = 1;
  ASSERT_EQ(v.query_gid(a.ctx, 1, 1, &empty), 0);  // an empty slot reads as zeros
  EXPECT_EQ(empty.raw[0], 0);

  ASSERT_EQ(to_init(a), 0);
  ibv_qp_attr rtr = rtr_attributes(b);
  rtr.ah_attr.is_global = 0;  // RoCE needs a GRH
  EXPECT_EQ(v.modify_qp(a.qp, &rtr, kRtrMask), EINVAL);
  rtr = rtr_attributes(b);
  rtr.ah_attr.grh.dgid.raw[15] = 99;  // not a GID of the fabric
  EXPECT_EQ(v.modify_qp(a.qp, &rtr, kRtrMask), EINVAL);
  rtr = rtr_attributes(b);
  rtr.ah_attr.grh.sgid_index = 1;  // an empty source slot
  EXPECT_EQ(v.modify_qp(a.qp, &rtr, kRtrMask), EINVAL);

  ASSERT_EQ(to_init(b), 0);
  ASSERT_EQ(to_rtr(a, b), 0);
  ASSERT_EQ(to_rtr(b, a), 0);
  ASSERT_EQ(to_rts(a), 0);
  ASSERT_EQ(to_rts(b), 0);
  Link& l = link_between(a, b, {.local_bytes = {"roce-v2"}});
  expect_completes(a, l.write(1), IBV_WC_SUCCESS);
  EXPECT_EQ(l.remote, l.local);
}

TEST_F(SoftVerbs, CloseDeviceIsRefusedWhileResourcesLive) {
  Endpoint& e = bare_endpoint();
  e.pd = v.alloc_pd(e.ctx);
  ASSERT_NE(e.pd, nullptr);
  EXPECT_EQ(v.close_device(e.ctx), EBUSY);
  EXPECT_EQ(provider.live_pds(), 1U);
  e.channel = v.create_comp_channel(e.ctx);
  ASSERT_NE(e.channel, nullptr);
  ASSERT_EQ(v.dealloc_pd(e.pd), 0);
  e.pd = nullptr;
  EXPECT_EQ(v.close_device(e.ctx), EBUSY);
}

// ---- Memory regions ---------------------------------------------------------

TEST_F(SoftVerbs, MemoryRegionsHaveDistinctKeysAndCheckAccess) {
  Endpoint& e = endpoint();
  std::array<char, 64> buffer{};
  ibv_mr* a = reg(e, buffer.data(), 32);
  ibv_mr* b = reg(e, buffer.data() + 32, 32, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->lkey, a->rkey);
  EXPECT_NE(a->lkey, b->lkey);
  EXPECT_NE(a->rkey, b->rkey);
  EXPECT_NE(a->lkey, b->rkey);
  EXPECT_NE(a->rkey, b->lkey);
  EXPECT_EQ(a->addr, buffer.data());
  EXPECT_EQ(a->length, 32U);
  EXPECT_EQ(a->pd, e.pd);
  EXPECT_EQ(a->context, e.ctx);
  EXPECT_EQ(provider.live_mrs(), 2U);
  EXPECT_EQ(provider.rkey_of(buffer.data() + 5), a->rkey);
  EXPECT_EQ(provider.rkey_of(buffer.data() + 40), b->rkey);
  std::array<char, 4> elsewhere{};
  EXPECT_EQ(provider.rkey_of(elsewhere.data()), std::nullopt);

  const auto refused = [&](void* addr, std::size_t length, int access) {
    errno = 0;
    return v.reg_mr(e.pd, addr, length, access) == nullptr && errno == EINVAL;
  };
  EXPECT_TRUE(refused(buffer.data(), 8, IBV_ACCESS_REMOTE_WRITE));   // remote write needs local write
  EXPECT_TRUE(refused(buffer.data(), 8, IBV_ACCESS_REMOTE_ATOMIC));  // so does remote atomic
  EXPECT_TRUE(refused(buffer.data(), 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND));
  EXPECT_TRUE(refused(nullptr, 8, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_TRUE(refused(buffer.data(), 0, IBV_ACCESS_LOCAL_WRITE));

  ibv_mr* relaxed = v.reg_mr_iova2(e.pd, buffer.data(), 8, reinterpret_cast<std::uintptr_t>(buffer.data()),
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_RELAXED_ORDERING);
  ASSERT_NE(relaxed, nullptr);
  e.mrs.push_back(relaxed);
  EXPECT_EQ(v.dealloc_pd(e.pd), EBUSY);  // regions still use it
}

TEST_F(SoftVerbs, FailNextRegMrFailsOnce) {
  Endpoint& e = endpoint();
  std::array<char, 16> buffer{};
  provider.fail_next_reg_mr(ENOMEM);
  errno = 0;
  EXPECT_EQ(v.reg_mr(e.pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(provider.live_mrs(), 0U);
  EXPECT_NE(reg(e, buffer.data(), buffer.size()), nullptr);
}

// ---- Queue pairs ------------------------------------------------------------

TEST_F(SoftVerbs, CreateQpEnforcesDeviceCaps) {
  SoftVerbsConfig config;
  config.max_qp_wr = 64;
  provider.reset(config);
  Endpoint& e = endpoint(64);
  Endpoint& other = endpoint();
  const auto refused = [&](auto change) {
    ibv_qp_init_attr init{};
    init.send_cq = e.cq;
    init.recv_cq = e.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 8;
    init.cap.max_send_sge = 1;
    change(init);
    errno = 0;
    return v.create_qp(e.pd, &init) == nullptr && errno == EINVAL;
  };
  EXPECT_TRUE(refused([](ibv_qp_init_attr& i) { i.cap.max_send_wr = 65; }));
  EXPECT_TRUE(refused([](ibv_qp_init_attr& i) { i.cap.max_send_sge = 2; }));
  EXPECT_TRUE(refused([](ibv_qp_init_attr& i) { i.qp_type = IBV_QPT_UD; }));
  EXPECT_TRUE(refused([](ibv_qp_init_attr& i) { i.send_cq = nullptr; }));
  EXPECT_TRUE(refused([&](ibv_qp_init_attr& i) { i.recv_cq = other.cq; }));  // another context's CQ
  EXPECT_EQ(provider.live_qps(), 2U);
  EXPECT_NE(e.qp->qp_num, other.qp->qp_num);
  EXPECT_EQ(e.qp->qp_num & ~0xffffffU, 0U);
  EXPECT_EQ(e.qp->state, IBV_QPS_RESET);
  expected_misuses = 1;  // the null send CQ
}

TEST_F(SoftVerbs, QpStateMachineRejectsWrongTransitionsAndMissingAttributes) {
  Endpoint& a = endpoint();
  Endpoint& b = endpoint();
  ibv_qp_attr attr = rtr_attributes(b);
  EXPECT_EQ(v.modify_qp(a.qp, &attr, kRtrMask), EINVAL);  // RESET→RTR

  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  EXPECT_EQ(v.modify_qp(a.qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);  // no access flags
  init.port_num = 2;
  EXPECT_EQ(v.modify_qp(a.qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL);
  ASSERT_EQ(to_init(a), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_INIT);

  std::array<char, 8> buffer{};
  ibv_mr* mr = reg(a, buffer.data(), buffer.size());
  WorkRequest wr(IBV_WR_RDMA_WRITE, buffer.data(), mr, 8, buffer.data(), mr->rkey, 1);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(post(a, wr, &bad), EINVAL);  // not ready to send
  EXPECT_EQ(bad, wr.get());

  attr = rtr_attributes(b);
  EXPECT_EQ(v.modify_qp(a.qp, &attr, kRtrMask & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
  attr.ah_attr.dlid = 0xbeef;  // no port has that LID
  EXPECT_EQ(v.modify_qp(a.qp, &attr, kRtrMask), EINVAL);
  attr = rtr_attributes(b);
  attr.max_dest_rd_atomic = 17;
  EXPECT_EQ(v.modify_qp(a.qp, &attr, kRtrMask), EINVAL);
  EXPECT_EQ(v.modify_qp(a.qp, &attr, kRtrMask | IBV_QP_SQ_PSN), EINVAL);  // not an RTR attribute
  ASSERT_EQ(to_rtr(a, b), 0);
  EXPECT_EQ(post(a, wr, &bad), EINVAL);

  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(v.modify_qp(a.qp, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY), EINVAL);
  ASSERT_EQ(to_rts(a), 0);
  EXPECT_EQ(a.qp->state, IBV_QPS_RTS);
  EXPECT_EQ(to_init(a), EINVAL);  // RTS→INIT

  ASSERT_EQ(set_state(a, IBV_QPS_ERR), 0);
  EXPECT_EQ(to_rts(a), EINVAL);  // only RESET leaves ERR
  ASSERT_EQ(set_state(a, IBV_QPS_RESET), 0);
  EXPECT_EQ(to_init(a), 0);
}

// ---- Transfers --------------------------------------------------------------

TEST_F(SoftVerbs, RdmaWriteAndReadMoveBytes) {
  auto [a, b] = connected_pair();
  std::array<char, 16> local{"local bytes"}, remote{"remote bytes"}, sink{};
  ibv_mr* lmr = reg(a, local.data(), local.size());
  ibv_mr* smr = reg(a, sink.data(), sink.size());
  std::array<char, 16> window{};
  ibv_mr* rmr = reg(b, remote.data(), remote.size());
  ibv_mr* wmr = reg(b, window.data(), window.size());

  WorkRequest read(IBV_WR_RDMA_READ, sink.data(), smr, 16, remote.data(), rmr->rkey, 7);
  WorkRequest write(IBV_WR_RDMA_WRITE, local.data(), lmr, 16, window.data(), wmr->rkey, 8);
  read.then(write);
  auto wc = post_and_poll(a, read, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].wr_id, 7U);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc[0].byte_len, 16U);
  EXPECT_EQ(wc[0].qp_num, a.qp->qp_num);
  EXPECT_EQ(wc[0].vendor_err, 0U);
  EXPECT_EQ(wc[1].wr_id, 8U);
  EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(sink, remote);
  EXPECT_EQ(window, local);
  EXPECT_EQ(provider.work_requests_posted(), 2U);
}

TEST_F(SoftVerbs, ChainExecutesInPostOrder) {
  auto [a, b] = connected_pair();
  std::array<char, 8> first{"first"}, back{}, target{};
  ibv_mr* fmr = reg(a, first.data(), first.size());
  ibv_mr* bmr = reg(a, back.data(), back.size());
  ibv_mr* tmr = reg(b, target.data(), target.size());
  // The read sees the write that was posted before it.
  WorkRequest write(IBV_WR_RDMA_WRITE, first.data(), fmr, 8, target.data(), tmr->rkey, 1);
  WorkRequest read(IBV_WR_RDMA_READ, back.data(), bmr, 8, target.data(), tmr->rkey, 2);
  write.unsignaled().then(read);
  auto wc = post_and_poll(a, write, 1);
  ASSERT_EQ(wc.size(), 1U);
  EXPECT_EQ(wc[0].wr_id, 2U);
  EXPECT_EQ(back, first);
}

TEST_F(SoftVerbs, OutOfBoundsRemoteRangeFailsAndLaterRequestsFlush) {
  auto [a, b] = connected_pair();
  std::array<char, 32> sink{}, remote{"remote"};
  ibv_mr* smr = reg(a, sink.data(), sink.size());
  ibv_mr* rmr = reg(b, remote.data(), 16);  // only the first half is registered
  provider.hold_work();
  WorkRequest past_end(IBV_WR_RDMA_READ, sink.data(), smr, 8, remote.data() + 12, rmr->rkey, 1);
  WorkRequest fine(IBV_WR_RDMA_READ, sink.data(), smr, 8, remote.data(), rmr->rkey, 2);
  ASSERT_EQ(post(a, past_end), 0);
  ASSERT_EQ(post(a, fine), 0);
  provider.release_work();
  auto wc = poll(a, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc[1].wr_id, 2U);
  EXPECT_EQ(sink, decltype(sink){});
  EXPECT_EQ(a.qp->state, IBV_QPS_RTS);  // as in libibverbs, only modify_qp updates the field

  // The responder rejected the request: its QP stopped too, and said so.
  expect_qp_event(b, IBV_EVENT_QP_ACCESS_ERR);

  // A QP in error accepts work and flushes it.
  expect_completes(a, WorkRequest(IBV_WR_RDMA_READ, sink.data(), smr, 8, remote.data(), rmr->rkey, 3),
                   IBV_WC_WR_FLUSH_ERR);
}

TEST_F(SoftVerbs, ReadNeedsRemoteReadOnTheTargetRegion) {
  Link& l = link({.remote_bytes = {"secret"},
                  .remote_region_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE});
  expect_completes(l.a, l.read(1), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(l.local, Region{});
}

TEST_F(SoftVerbs, KeysAreCheckedAgainstTheRightTableAndDomain) {
  const auto status_of = [&](auto prepare) {
    Link& l = link({.remote_bytes = {"remote"}});
    ibv_mr* foreign = reg(l.b, l.local.data(), l.local.size());  // the right bytes, the wrong PD
    ibv_mr* readonly = reg(l.a, l.local.data(), l.local.size(), IBV_ACCESS_REMOTE_READ);
    WorkRequest read = l.read(1);
    prepare(*read.get(), l.lmr, l.rmr, foreign, readonly);
    EXPECT_EQ(post(l.a, read), 0);
    auto wc = poll(l.a, 1);
    auto status = wc.size() == 1 ? wc[0].status : IBV_WC_GENERAL_ERR;
    release_endpoints();
    return status;
  };
  EXPECT_EQ(status_of([](ibv_send_wr& wr, ibv_mr*, ibv_mr* rmr, ibv_mr*, ibv_mr*) { wr.wr.rdma.rkey = rmr->lkey; }),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(status_of([](ibv_send_wr& wr, ibv_mr* smr, ibv_mr*, ibv_mr*, ibv_mr*) { wr.sg_list->lkey = smr->rkey; }),
            IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(status_of([](ibv_send_wr& wr, ibv_mr*, ibv_mr*, ibv_mr* f, ibv_mr*) { wr.sg_list->lkey = f->lkey; }),
            IBV_WC_LOC_PROT_ERR);
  // A read lands in local memory: the local region needs local write.
  EXPECT_EQ(status_of([](ibv_send_wr& wr, ibv_mr*, ibv_mr*, ibv_mr*, ibv_mr* ro) { wr.sg_list->lkey = ro->lkey; }),
            IBV_WC_LOC_PROT_ERR);
}

TEST_F(SoftVerbs, RequestLongerThanMaxMsgSzIsALocalLengthError) {
  SoftVerbsConfig config;
  config.max_msg_sz = 4096;
  provider.reset(config);
  auto [a, b] = connected_pair();
  std::vector<char> local(8192), remote(8192);
  ibv_mr* lmr = reg(a, local.data(), local.size());
  ibv_mr* rmr = reg(b, remote.data(), remote.size());
  WorkRequest at_limit(IBV_WR_RDMA_WRITE, local.data(), lmr, 4096, remote.data(), rmr->rkey, 1);
  WorkRequest too_long(IBV_WR_RDMA_WRITE, local.data(), lmr, 4097, remote.data(), rmr->rkey, 2);
  at_limit.then(too_long);
  auto wc = post_and_poll(a, at_limit, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].status, IBV_WC_LOC_LEN_ERR);
}

TEST_F(SoftVerbs, ZeroLengthRequestsComplete) {
  auto [a, b] = connected_pair();
  std::array<char, 8> buffer{};
  ibv_mr* mr = reg(a, buffer.data(), buffer.size());
  // No R_Key is checked for a zero-length operation.
  WorkRequest no_sge(IBV_WR_RDMA_READ, nullptr, nullptr, 0, nullptr, 0xdead, 1);
  no_sge.without_sge();
  WorkRequest empty_sge(IBV_WR_RDMA_WRITE, buffer.data(), mr, 0, nullptr, 0xdead, 2);
  no_sge.then(empty_sge);
  auto wc = post_and_poll(a, no_sge, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 0U);
  EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
}

TEST_F(SoftVerbs, ResponderQpMustAllowTheOperation) {
  // b's QP takes writes only.
  Link& l = link({.responder_qp_access = IBV_ACCESS_REMOTE_WRITE, .remote_bytes = {"remote"}});
  expect_completes(l.a, l.read(1), IBV_WC_REM_INV_REQ_ERR);
  expect_qp_event(l.b, IBV_EVENT_QP_REQ_ERR);
  // b's QP is in error now: what it posts flushes.
  expect_completes(l.b, l.reply(2), IBV_WC_WR_FLUSH_ERR);
}

TEST_F(SoftVerbs, UnansweredRequestsExhaustRetries) {
  rts_timeout = 4;  // 65.5 us per try, 8 tries
  Endpoint& a = endpoint();
  Endpoint& b = endpoint();
  Endpoint& c = endpoint();
  ASSERT_EQ(to_init(a), 0);
  ASSERT_EQ(to_init(b), 0);
  ASSERT_EQ(to_init(c), 0);
  ASSERT_EQ(to_rtr(a, b), 0);
  ASSERT_EQ(to_rtr(b, c), 0);  // b answers c, not a
  ASSERT_EQ(to_rts(a), 0);
  Link& ab = link_between(a, b);
  WorkRequest write = ab.write(1);
  WorkRequest behind = ab.write(3);
  write.then(behind);
  const auto start = std::chrono::steady_clock::now();
  auto wc = post_and_poll(a, write, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);  // it waited behind, then flushed
  EXPECT_GE(std::chrono::steady_clock::now() - start, 8 * 65536ns);

  // A peer whose QP is gone does not answer either.
  Link& orphaned = link();
  ASSERT_EQ(v.destroy_qp(orphaned.b.qp), 0);
  orphaned.b.qp = nullptr;
  expect_completes(orphaned.a, orphaned.write(2), IBV_WC_RETRY_EXC_ERR);
}

TEST_F(SoftVerbs, RequestsWaitForAResponderThatIsNotReadyYet) {
  // As on hardware, a side in RTS may post before its peer reached RTR: the
  // request is retried until the peer answers.
  Endpoint& a = endpoint();
  Endpoint& b = endpoint();
  ASSERT_EQ(to_init(a), 0);
  ASSERT_EQ(to_init(b), 0);
  ASSERT_EQ(to_rtr(a, b), 0);
  ASSERT_EQ(to_rts(a), 0);
  Link& l = link_between(a, b, {.local_bytes = {"early"}});
  WorkRequest write = l.write(1);
  ASSERT_EQ(post(a, write), 0);
  ASSERT_EQ(to_rtr(b, a), 0);
  expect_completion(a, IBV_WC_SUCCESS);
  EXPECT_EQ(l.remote, l.local);
}

TEST_F(SoftVerbs, DeregisteredRegionFailsQueuedRequests) {
  Link& l = link({.local_bytes = {"bytes"}});
  provider.hold_work();
  WorkRequest write = l.write(1);
  ASSERT_EQ(post(l.a, write), 0);
  ASSERT_EQ(v.dereg_mr(l.rmr), 0);
  l.b.mrs.clear();
  provider.release_work();
  expect_completion(l.a, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(l.remote, Region{});
}

// ---- Send queue depth -------------------------------------------------------

TEST_F(SoftVerbs, SendQueueOverrunIsRefusedAndCounted) {
  Link& l = link({.max_send_wr = 2});
  WorkRequest w1 = l.write(1);
  WorkRequest w2 = l.write(2);
  WorkRequest w3 = l.write(3);
  w1.then(w2).then(w3);
  provider.hold_work();
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(post(l.a, w1, &bad), ENOMEM);
  EXPECT_EQ(bad, w3.get());  // the first two were accepted
  EXPECT_EQ(provider.work_requests_posted(), 2U);
  EXPECT_EQ(provider.overruns(), 1U);
  EXPECT_EQ(provider.max_outstanding(), 2U);

  // Executed but not yet polled: the slots are still taken.
  provider.release_work();
  ASSERT_TRUE(drained());
  EXPECT_EQ(post(l.a, w3, &bad), ENOMEM);
  EXPECT_EQ(provider.overruns(), 2U);
  ASSERT_EQ(poll(l.a, 2).size(), 2U);
  EXPECT_EQ(post(l.a, w3), 0);
  EXPECT_EQ(poll(l.a, 1).size(), 1U);
  EXPECT_EQ(provider.max_outstanding(), 2U);
}

TEST_F(SoftVerbs, UnsignaledRequestsHoldSlotsUntilALaterCompletionIsPolled) {
  Link& l = link({.max_send_wr = 3});
  WorkRequest quiet1 = l.write(1);
  WorkRequest quiet2 = l.write(2);
  WorkRequest loud = l.write(3);
  quiet1.unsignaled().then(quiet2);
  quiet2.unsignaled();
  ASSERT_EQ(post(l.a, quiet1), 0);
  ASSERT_TRUE(drained());
  EXPECT_EQ(poll_once(l.a), 0);  // unsignaled successes complete silently
  auto got = post_and_poll(l.a, loud, 1);
  ASSERT_EQ(got.size(), 1U);
  EXPECT_EQ(got[0].wr_id, 3U);
  // That completion freed all three slots.
  WorkRequest n1 = l.write(4);
  WorkRequest n2 = l.write(5);
  WorkRequest n3 = l.write(6);
  n1.then(n2).then(n3);
  EXPECT_EQ(post_and_poll(l.a, n1, 3).size(), 3U);
  EXPECT_EQ(provider.overruns(), 0U);
}

TEST_F(SoftVerbs, CqOverrunIsCountedAndRaisesCqError) {
  Link& l = link({.max_send_wr = 4, .cqe = 2});
  WorkRequest w1 = l.write(1);
  WorkRequest w2 = l.write(2);
  WorkRequest w3 = l.write(3);
  w1.then(w2).then(w3);
  ASSERT_EQ(post(l.a, w1), 0);
  ASSERT_TRUE(drained());
  EXPECT_EQ(provider.cq_overruns(), 1U);
  EXPECT_EQ(poll(l.a, 2).size(), 2U);
  EXPECT_EQ(poll_once(l.a), 0);  // the third completion did not fit
  ibv_async_event event{};
  ASSERT_TRUE(next_async_event(l.a.ctx, event));
  EXPECT_EQ(event.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(event.element.cq, l.a.cq);
  EXPECT_EQ(v.destroy_cq(l.a.cq), EBUSY);  // qp, and an unacknowledged event
  v.ack_async_event(&event);
}

TEST_F(SoftVerbs, ResetAndDestroyDiscardQueuedWorkWithoutCompletions) {
  Link& l = link();
  provider.hold_work();
  WorkRequest w1 = l.write(1);
  ASSERT_EQ(post(l.a, w1), 0);
  ASSERT_EQ(set_state(l.a, IBV_QPS_RESET), 0);
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 0U);

  WorkRequest w2 = l.reply(2);
  ASSERT_EQ(post(l.b, w2), 0);
  ASSERT_EQ(v.destroy_qp(l.b.qp), 0);
  l.b.qp = nullptr;
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 0U);
  provider.release_work();
  EXPECT_EQ(poll_once(l.a), 0);
  EXPECT_EQ(poll_once(l.b), 0);
}

TEST_F(SoftVerbs, ConcurrentPostersStayWithinTheirQueues) {
  constexpr std::uint32_t depth = 4;
  constexpr std::uint64_t per_thread = 300;
  std::array<Endpoint*, 2> requesters{&endpoint(depth), &endpoint(depth)};
  Endpoint& target = endpoint();
  Endpoint& target2 = endpoint();
  connect(*requesters[0], target);
  connect(*requesters[1], target2);
  std::array<std::array<char, 64>, 2> sources{};
  std::array<std::array<char, 64>, 2> sinks{};
  std::array<ibv_mr*, 2> lmrs{reg(*requesters[0], sources[0].data(), 64), reg(*requesters[1], sources[1].data(), 64)};
  std::array<ibv_mr*, 2> rmrs{reg(target, sinks[0].data(), 64), reg(target2, sinks[1].data(), 64)};

  // Each thread keeps its queue full: it posts while it has room and polls to make room.
  const auto run = [&](std::size_t i, std::uint64_t& good) {
    good = keep_queue_full(*requesters[i], depth, per_thread, [&](std::uint64_t n) {
      return WorkRequest(IBV_WR_RDMA_WRITE, sources[i].data(), lmrs[i], 64, sinks[i].data(), rmrs[i]->rkey, n);
    });
  };
  std::array<std::uint64_t, 2> good{};
  std::thread other(run, 1, std::ref(good[1]));
  run(0, good[0]);
  other.join();
  EXPECT_EQ(good[0], per_thread);
  EXPECT_EQ(good[1], per_thread);
  EXPECT_EQ(provider.overruns(), 0U);
  EXPECT_EQ(provider.max_outstanding(), depth);
  EXPECT_EQ(provider.work_requests_posted(), 2 * per_thread);
}

// ---- Atomics ----------------------------------------------------------------

TEST_F(SoftVerbs, AtomicsAnswerTheOldValueAndChangeOnlyTheirWord) {
  auto [a, b] = connected_pair({.responder_qp_access = kAtomicQpAccess});
  std::uint64_t result = 0;
  std::array<std::uint64_t, 3> words{0, 40, 0};
  ibv_mr* rmr = reg(a, &result, sizeof result);
  ibv_mr* wmr = reg(b, words.data(), sizeof words, kAtomicRegion);
  const auto apply = [&](ibv_wr_opcode opcode, std::uint64_t compare_add, std::uint64_t swap, ibv_wc_opcode done) {
    WorkRequest wr(opcode, &result, rmr, &words[1], wmr->rkey, compare_add, swap, 1);
    auto wc = post_and_poll(a, wr, 1);
    ASSERT_EQ(wc.size(), 1U);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].opcode, done);
    EXPECT_EQ(wc[0].byte_len, 8U);
  };
  apply(IBV_WR_ATOMIC_FETCH_AND_ADD, 2, 0, IBV_WC_FETCH_ADD);
  EXPECT_EQ(result, 40U);
  EXPECT_EQ(words[1], 42U);
  apply(IBV_WR_ATOMIC_CMP_AND_SWP, 7, 99, IBV_WC_COMP_SWAP);  // compares 7: a miss
  EXPECT_EQ(result, 42U);
  EXPECT_EQ(words[1], 42U);
  apply(IBV_WR_ATOMIC_CMP_AND_SWP, 42, 99, IBV_WC_COMP_SWAP);
  EXPECT_EQ(result, 42U);
  EXPECT_EQ(words[1], 99U);
  EXPECT_EQ(words[0] | words[2], 0U) << "a neighbouring word changed";
}

TEST_F(SoftVerbs, AnAtomicOnARegionWithoutRemoteAtomicIsARemoteAccessError) {
  auto [a, b] = connected_pair({.responder_qp_access = kAtomicQpAccess});
  std::uint64_t result = 0;
  std::uint64_t word = 5;
  ibv_mr* rmr = reg(a, &result, sizeof result);
  ibv_mr* wmr = reg(b, &word, sizeof word, kFullAccess);  // read and write, no atomics
  expect_completes(a, WorkRequest(IBV_WR_ATOMIC_FETCH_AND_ADD, &result, rmr, &word, wmr->rkey, 1, 0, 1),
                   IBV_WC_REM_ACCESS_ERR);
  expect_qp_event(b, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(word, 5U);
  EXPECT_EQ(result, 0U);
}

TEST_F(SoftVerbs, AtomicsTheResponderCannotServeFailAsANicWould) {
  // Each case on a fresh pair: the failure stops both QPs.
  const auto status_of = [&](int qp_access, std::size_t registered_words, std::size_t offset) {
    auto [a, b] = connected_pair({.responder_qp_access = qp_access});
    std::uint64_t result = 0;
    std::array<std::uint64_t, 2> words{};
    ibv_mr* rmr = reg(a, &result, sizeof result);
    ibv_mr* wmr = reg(b, words.data(), registered_words * sizeof(std::uint64_t), kAtomicRegion);
    const auto* target = reinterpret_cast<const char*>(words.data()) + offset;
    WorkRequest wr(IBV_WR_ATOMIC_CMP_AND_SWP, &result, rmr, target, wmr->rkey, 0, 1, 1);
    auto wc = post_and_poll(a, wr, 1);
    ibv_async_event event{};
    const bool raised = next_async_event(b.ctx, event);
    if (raised) v.ack_async_event(&event);
    EXPECT_TRUE(raised) << "the responder says why it stopped";
    EXPECT_EQ(words, (std::array<std::uint64_t, 2>{})) << "a refused atomic changed a word";
    release_endpoints();
    return wc.size() == 1 ? wc[0].status : IBV_WC_GENERAL_ERR;
  };
  EXPECT_EQ(status_of(kAtomicQpAccess, 2, 4), IBV_WC_REM_INV_REQ_ERR) << "a misaligned word";
  EXPECT_EQ(status_of(kAtomicQpAccess, 1, 8), IBV_WC_REM_ACCESS_ERR) << "a word outside the region";
  EXPECT_EQ(status_of(kRemoteAccess, 2, 0), IBV_WC_REM_INV_REQ_ERR) << "a queue pair that takes no atomics";
}

TEST_F(SoftVerbs, ADeviceWithoutAtomicsRefusesAtomicWorkRequests) {
  provider.reset(SoftVerbsConfig{.atomic_cap = IBV_ATOMIC_NONE});
  auto [a, b] = connected_pair({.responder_qp_access = kAtomicQpAccess});
  ibv_device_attr dev{};
  ASSERT_EQ(v.query_device(a.ctx, &dev), 0);
  EXPECT_EQ(dev.atomic_cap, IBV_ATOMIC_NONE);
  std::uint64_t result = 0;
  std::uint64_t word = 0;
  ibv_mr* rmr = reg(a, &result, sizeof result);
  ibv_mr* wmr = reg(b, &word, sizeof word, kAtomicRegion);
  WorkRequest wr(IBV_WR_ATOMIC_FETCH_AND_ADD, &result, rmr, &word, wmr->rkey, 1, 0, 1);
  EXPECT_EQ(post(a, wr), EINVAL);
  EXPECT_TRUE(drained());
  EXPECT_EQ(poll_once(a), 0);
  EXPECT_EQ(word, 0U);
}

TEST_F(SoftVerbs, AtomicsStayAtomicAgainstEachOtherAndAgainstHostAtomicRef) {
  constexpr std::uint32_t depth = 8;
  constexpr std::uint64_t per_side = 400;
  // Two requesters, each on its own context and responder; both responders
  // registered the same word.
  std::array<Endpoint*, 2> requesters{&endpoint(depth), &endpoint(depth)};
  std::array<Endpoint*, 2> responders{&endpoint(), &endpoint()};
  for (std::size_t i = 0; i < 2; ++i) connect(*requesters[i], *responders[i], kRemoteAccess, kAtomicQpAccess);
  alignas(8) std::uint64_t word = 0;
  std::array<std::uint64_t, 2> results{};
  std::array<ibv_mr*, 2> rmrs{reg(*requesters[0], &results[0], 8), reg(*requesters[1], &results[1], 8)};
  std::array<ibv_mr*, 2> wmrs{reg(*responders[0], &word, 8, kAtomicRegion),
                              reg(*responders[1], &word, 8, kAtomicRegion)};

  const auto run = [&](std::size_t i, std::uint64_t& good) {
    good = keep_queue_full(*requesters[i], depth, per_side, [&](std::uint64_t n) {
      return WorkRequest(IBV_WR_ATOMIC_FETCH_AND_ADD, &results[i], rmrs[i], &word, wmrs[i]->rkey, 1, 0, n);
    });
  };
  std::array<std::uint64_t, 2> good{};
  std::thread other(run, 1, std::ref(good[1]));
  std::thread host([&] {
    std::atomic_ref<std::uint64_t> shared(word);
    for (std::uint64_t k = 0; k < per_side; ++k) shared.fetch_add(1);
  });
  run(0, good[0]);
  other.join();
  host.join();
  EXPECT_EQ(good[0], per_side);
  EXPECT_EQ(good[1], per_side);
  EXPECT_EQ(std::atomic_ref<std::uint64_t>(word).load(), 3 * per_side) << "an increment was lost";
}

// ---- Receives: SEND and immediate data -------------------------------------

TEST_F(SoftVerbs, ASendLandsInTheOldestReceiveAfterTheWritesPostedBeforeIt) {
  Link& l = link(LinkOptions{.local_bytes = {"written"}});
  std::array<char, 16> first{}, second{};
  ibv_mr* fmr = reg(l.b, first.data(), first.size());
  ibv_mr* smr = reg(l.b, second.data(), second.size());
  ASSERT_EQ(post_receive(l.b, first.data(), 16, fmr, 21), 0);
  ASSERT_EQ(post_receive(l.b, second.data(), 16, smr, 22), 0);
  std::array<char, 6> message{"hello"};
  ibv_mr* mmr = reg(l.a, message.data(), message.size());
  WorkRequest write = l.write(1);
  WorkRequest send(IBV_WR_SEND, message.data(), mmr, 6, nullptr, 0, 2);
  WorkRequest with_imm(IBV_WR_SEND_WITH_IMM, message.data(), mmr, 3, nullptr, 0, 3);
  with_imm.with_immediate(0xabcdef01);
  write.unsignaled().then(send).then(with_imm);
  ASSERT_EQ(post(l.a, write), 0);

  // The first receive completes with the write's bytes already in place:
  // looked at the moment its completion is polled.
  ibv_wc received{};
  ASSERT_TRUE(provider.wait_until([&] { return v.poll_cq(l.b.cq, 1, &received) == 1; }, 1000ms));
  EXPECT_EQ(l.remote, l.local) << "the SEND completed before the write before it";
  EXPECT_EQ(received.wr_id, 21U);
  EXPECT_EQ(received.status, IBV_WC_SUCCESS);
  EXPECT_EQ(received.opcode, IBV_WC_RECV);
  EXPECT_EQ(received.byte_len, 6U);
  EXPECT_EQ(received.qp_num, l.b.qp->qp_num);
  EXPECT_EQ(received.src_qp, l.a.qp->qp_num);
  EXPECT_EQ(received.wc_flags & IBV_WC_WITH_IMM, 0U);
  EXPECT_STREQ(first.data(), "hello");
  const auto next = poll(l.b, 1);
  ASSERT_EQ(next.size(), 1U);
  EXPECT_EQ(next[0].wr_id, 22U);
  EXPECT_EQ(next[0].byte_len, 3U);
  EXPECT_NE(next[0].wc_flags & IBV_WC_WITH_IMM, 0U);
  EXPECT_EQ(next[0].imm_data, 0xabcdef01U);
  EXPECT_EQ(std::string(second.data(), 3), "hel");

  const auto sent = poll(l.a, 2);
  ASSERT_EQ(sent.size(), 2U);
  EXPECT_EQ(sent[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(sent[0].wr_id, 2U);
  EXPECT_EQ(sent[1].opcode, IBV_WC_SEND);
  EXPECT_EQ(sent[1].wr_id, 3U);
  EXPECT_EQ(provider.receives_posted(), 2U);
  EXPECT_EQ(provider.rnr_naks(), 0U);
}

TEST_F(SoftVerbs, AWriteWithImmediateMovesItsBytesAndCompletesAReceiveWithoutItsBuffer) {
  Link& l = link(LinkOptions{.local_bytes = {"payload"}});
  std::array<char, 8> untouched{"intact"};
  ibv_mr* umr = reg(l.b, untouched.data(), untouched.size());
  ASSERT_EQ(post_receive(l.b, untouched.data(), 8, umr, 31), 0);
  WorkRequest with_imm(IBV_WR_RDMA_WRITE_WITH_IMM, l.local.data(), l.lmr, 8, l.remote.data(), l.rmr->rkey, 5);
  with_imm.with_immediate(0x01020304);
  ASSERT_EQ(post(l.a, with_imm), 0);
  const auto received = poll(l.b, 1);
  ASSERT_EQ(received.size(), 1U);
  EXPECT_EQ(received[0].wr_id, 31U);
  EXPECT_EQ(received[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(received[0].byte_len, 8U);
  EXPECT_NE(received[0].wc_flags & IBV_WC_WITH_IMM, 0U);
  EXPECT_EQ(received[0].imm_data, 0x01020304U);
  EXPECT_EQ(l.remote, l.local);
  EXPECT_STREQ(untouched.data(), "intact") << "a write with immediate left bytes in the receive's buffer";
  const auto completions = poll(l.a, 1);
  ASSERT_EQ(completions.size(), 1U);
  EXPECT_EQ(completions[0].wr_id, 5U);
  EXPECT_EQ(completions[0].opcode, IBV_WC_RDMA_WRITE);
}

TEST_F(SoftVerbs, ASendWithNoReceivePostedIsAnRnrErrorOnceRetriesAreSpent) {
  rts_rnr_retry = 0;
  Link& l = link();
  std::array<char, 8> message{"lost"};
  ibv_mr* mmr = reg(l.a, message.data(), message.size());
  WorkRequest send(IBV_WR_SEND, message.data(), mmr, 8, nullptr, 0, 6);
  WorkRequest behind = l.write(7);
  send.then(behind);
  ASSERT_EQ(post(l.a, send), 0);
  const auto wc = poll(l.a, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].wr_id, 6U);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].wr_id, 7U);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR) << "the request behind it waited, then flushed";
  EXPECT_EQ(l.remote, Region{}) << "the write behind the SEND ran";
  EXPECT_EQ(provider.rnr_naks(), 1U);
  // The responder was not affected: no completion, no event, and a receive
  // posted now waits instead of flushing.
  std::array<char, 8> inbox{};
  ibv_mr* imr = reg(l.b, inbox.data(), inbox.size());
  ASSERT_EQ(post_receive(l.b, inbox.data(), 8, imr, 8), 0);
  EXPECT_EQ(poll_once(l.b), 0);
  EXPECT_FALSE(readable(l.b.ctx->async_fd, 0ms)) << "the responder raised an event";
}

TEST_F(SoftVerbs, AnRnrRetryOfSevenWaitsForAReceiveAndThenDelivers) {
  Link& l = link();  // rnr_retry 7
  std::array<char, 8> message{"later"}, inbox{};
  ibv_mr* mmr = reg(l.a, message.data(), message.size());
  ibv_mr* imr = reg(l.b, inbox.data(), inbox.size());
  WorkRequest send(IBV_WR_SEND, message.data(), mmr, 8, nullptr, 0, 9);
  ASSERT_EQ(post(l.a, send), 0);
  ASSERT_TRUE(provider.wait_until([&] { return provider.rnr_naks() == 1; }, 1000ms));
  EXPECT_EQ(poll_once(l.a), 0) << "completed without a receive";
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 1U);
  ASSERT_EQ(post_receive(l.b, inbox.data(), 8, imr, 10), 0);
  const auto received = poll(l.b, 1);
  ASSERT_EQ(received.size(), 1U);
  EXPECT_EQ(received[0].status, IBV_WC_SUCCESS);
  EXPECT_STREQ(inbox.data(), "later");
  expect_completion(l.a, IBV_WC_SUCCESS);
}

TEST_F(SoftVerbs, ASendLongerThanItsReceiveFailsBothSides) {
  Link& l = link();
  std::array<char, 16> message{"far too long"}, inbox{}, spare{};
  ibv_mr* mmr = reg(l.a, message.data(), message.size());
  ibv_mr* imr = reg(l.b, inbox.data(), inbox.size());
  ibv_mr* smr = reg(l.b, spare.data(), spare.size());
  ASSERT_EQ(post_receive(l.b, inbox.data(), 4, imr, 11), 0);
  ASSERT_EQ(post_receive(l.b, spare.data(), 16, smr, 12), 0);
  WorkRequest send(IBV_WR_SEND, message.data(), mmr, 13, nullptr, 0, 13);
  ASSERT_EQ(post(l.a, send), 0);
  expect_completion(l.a, IBV_WC_REM_INV_REQ_ERR);
  const auto received = poll(l.b, 2);
  ASSERT_EQ(received.size(), 2U);
  EXPECT_EQ(received[0].wr_id, 11U);
  EXPECT_EQ(received[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(received[1].wr_id, 12U);
  EXPECT_EQ(received[1].status, IBV_WC_WR_FLUSH_ERR) << "the responder's QP stopped too";
  EXPECT_EQ(inbox, decltype(inbox){}) << "bytes landed past a receive's end";
}

TEST_F(SoftVerbs, ReceivesArePostedFromInitWithinTheQueueDepthAndFlushInTheErrorState) {
  Endpoint& e = endpoint(16, 64, 2);
  std::array<char, 8> buffer{};
  ibv_mr* mr = reg(e, buffer.data(), buffer.size());
  EXPECT_EQ(post_receive(e, buffer.data(), 8, mr, 1), EINVAL) << "a QP in RESET takes no receive";
  ASSERT_EQ(to_init(e), 0);
  EXPECT_EQ(post_receive(e, buffer.data(), 8, mr, 1), 0);
  EXPECT_EQ(post_receive(e, buffer.data(), 8, mr, 2), 0);
  EXPECT_EQ(post_receive(e, buffer.data(), 8, mr, 3), ENOMEM) << "past cap.max_recv_wr";
  ASSERT_EQ(set_state(e, IBV_QPS_ERR), 0);
  auto flushed = poll(e, 2);
  ASSERT_EQ(flushed.size(), 2U);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(flushed[i].wr_id, i + 1);
    EXPECT_EQ(flushed[i].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(flushed[i].opcode, IBV_WC_RECV);
  }
  EXPECT_EQ(post_receive(e, buffer.data(), 8, mr, 4), 0) << "a QP in the error state takes receives, and flushes them";
  expect_completion(e, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(provider.receives_posted(), 3U);
}

// ---- Completion channel -----------------------------------------------------

TEST_F(SoftVerbs, CompletionChannelSignalsOnlyArmedCompletions) {
  Link& l = link();
  Endpoint& a = l.a;
  make_nonblocking(a.channel->fd);
  ibv_cq* cq = nullptr;
  void* cq_context = nullptr;
  errno = 0;
  EXPECT_EQ(v.get_cq_event(a.channel, &cq, &cq_context), -1);
  EXPECT_EQ(errno, EAGAIN);

  WorkRequest unarmed = l.write(1);
  ASSERT_EQ(post_and_poll(a, unarmed, 1).size(), 1U);
  EXPECT_FALSE(readable(a.channel->fd, 0ms));

  // Arming does not notify for completions already queued, only new ones.
  provider.hold_work();
  WorkRequest queued = l.write(2);
  ASSERT_EQ(post(a, queued), 0);
  ASSERT_EQ(v.req_notify_cq(a.cq, 0), 0);
  EXPECT_FALSE(readable(a.channel->fd, 0ms));
  provider.release_work();
  ASSERT_TRUE(readable(a.channel->fd, 1000ms));
  ASSERT_EQ(v.get_cq_event(a.channel, &cq, &cq_context), 0);
  EXPECT_EQ(cq, a.cq);
  EXPECT_EQ(cq_context, &a);
  EXPECT_EQ(provider.unacked_cq_events(), 1U);
  EXPECT_EQ(v.destroy_cq(a.cq), EBUSY);
  v.ack_cq_events(a.cq, 1);
  EXPECT_EQ(provider.unacked_cq_events(), 0U);
  EXPECT_EQ(v.get_cq_event(a.channel, &cq, &cq_context), -1);  // one event per arming
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(poll(a, 1).size(), 1U);
}

TEST_F(SoftVerbs, DestroyIsRefusedWhileInUse) {
  Endpoint& e = endpoint();
  EXPECT_EQ(v.destroy_cq(e.cq), EBUSY);               // the QP uses it
  EXPECT_EQ(v.destroy_comp_channel(e.channel), EBUSY);  // the CQ uses it
  EXPECT_EQ(v.dealloc_pd(e.pd), EBUSY);               // the QP uses it
  ASSERT_EQ(v.destroy_qp(e.qp), 0);
  e.qp = nullptr;
  EXPECT_EQ(v.destroy_cq(e.cq), 0);
  e.cq = nullptr;
  EXPECT_EQ(v.destroy_comp_channel(e.channel), 0);
  e.channel = nullptr;
}

// ---- Faults -----------------------------------------------------------------

TEST_F(SoftVerbs, MoveQpsToErrorFlushesAndRaisesQpFatal) {
  Link& l = link();
  provider.hold_work();
  WorkRequest w1 = l.write(1);
  WorkRequest w2 = l.write(2);
  w1.unsignaled().then(w2);  // flushes complete even when unsignaled
  ASSERT_EQ(post(l.a, w1), 0);
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 2U);
  provider.move_qps_to_error();
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 0U);
  auto wc = poll(l.a, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].wr_id, 1U);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);

  for (Endpoint* e : {&l.a, &l.b}) {
    make_nonblocking(e->ctx->async_fd);
    ibv_async_event event{};
    ASSERT_TRUE(next_async_event(e->ctx, event));
    EXPECT_EQ(event.event_type, IBV_EVENT_QP_FATAL);
    EXPECT_EQ(event.element.qp, e->qp);
    EXPECT_EQ(v.destroy_qp(e->qp), EBUSY);  // the event is not acknowledged yet
    v.ack_async_event(&event);
    errno = 0;
    EXPECT_EQ(v.get_async_event(e->ctx, &event), -1);
    EXPECT_EQ(errno, EAGAIN);
  }
  EXPECT_EQ(provider.unacked_async_events(), 0U);
}

TEST_F(SoftVerbs, RaisedAsyncEventsReachEveryContext) {
  Endpoint& a = endpoint();
  Endpoint& b = endpoint();
  provider.raise_async_event(IBV_EVENT_PORT_ERR);
  provider.raise_async_event(IBV_EVENT_COMM_EST);
  for (Endpoint* e : {&a, &b}) {
    ibv_async_event event{};
    ASSERT_TRUE(next_async_event(e->ctx, event));
    EXPECT_EQ(event.event_type, IBV_EVENT_PORT_ERR);
    EXPECT_EQ(event.element.port_num, 1);
    v.ack_async_event(&event);
    expect_qp_event(*e, IBV_EVENT_COMM_EST);
  }
}

TEST_F(SoftVerbs, FailNextCompletionFailsOneRequestAndStopsTheQp) {
  Link& l = link({.local_bytes = {"bytes"}});
  provider.fail_next_completion(IBV_WC_RETRY_EXC_ERR);
  WorkRequest w1 = l.write(1);
  WorkRequest w2 = l.write(2);
  w1.unsignaled().then(w2);  // errors complete even when unsignaled
  auto wc = post_and_poll(l.a, w1, 2);
  ASSERT_EQ(wc.size(), 2U);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(l.remote, Region{});
}

TEST_F(SoftVerbs, HoldWorkKeepsRequestsInFlightUntilReleased) {
  Link& l = link({.local_bytes = {"held"}});
  provider.hold_work();
  WorkRequest write = l.write(1);
  ASSERT_EQ(post(l.a, write), 0);
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 1U);
  EXPECT_EQ(poll_once(l.a), 0);
  EXPECT_EQ(l.remote, Region{});
  provider.release_work();
  EXPECT_EQ(poll(l.a, 1).size(), 1U);
  EXPECT_EQ(l.remote, l.local);
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 0U);
}

TEST_F(SoftVerbs, WorkDelayDefersExecution) {
  Link& l = link();
  provider.set_work_delay(20ms);
  const auto start = std::chrono::steady_clock::now();
  WorkRequest write = l.write(1);
  ASSERT_EQ(post_and_poll(l.a, write, 1).size(), 1U);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
}

// ---- Misuse and reset -------------------------------------------------------

TEST_F(SoftVerbs, StaleHandlesAreCountedNotDereferenced) {
  Endpoint& e = endpoint();
  std::array<char, 8> buffer{};
  ibv_mr* mr = v.reg_mr(e.pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(v.dereg_mr(mr), 0);
  EXPECT_EQ(v.dereg_mr(mr), EINVAL);
  EXPECT_NE(provider.last_misuse().find("ibv_dereg_mr"), std::string::npos) << provider.last_misuse();
  ibv_device** list = v.get_device_list(nullptr);
  v.free_device_list(list);
  v.free_device_list(list);
  EXPECT_EQ(provider.misuses(), 2U);
  expected_misuses = 2;
}

TEST_F(SoftVerbs, ResetLeavesEarlierObjectsUsableButUncounted) {
  Link& l = link({.local_bytes = {"stale"}});
  provider.hold_work();
  WorkRequest queued = l.write(1);
  ASSERT_EQ(post(l.a, queued), 0);

  provider.reset();  // as if the test had ended with a backend still shutting down
  EXPECT_EQ(provider.live_qps(), 0U);
  EXPECT_EQ(provider.live_mrs(), 0U);
  EXPECT_EQ(provider.open_contexts(), 0U);
  EXPECT_EQ(provider.work_requests_executing_or_queued(), 0U);
  // The leftover QP stopped: its queued request flushed and moved nothing,
  // and so does a later one.
  expect_completion(l.a, IBV_WC_WR_FLUSH_ERR);
  expect_completes(l.a, l.write(2), IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(l.remote, Region{});
  EXPECT_EQ(provider.work_requests_posted(), 0U);  // counted for the generation that made the QP
  // TearDown then destroys everything without a single misuse.
}

TEST_F(SoftVerbs, ClosingAnFdTheProviderOwnsIsAMisuse) {
  Endpoint& e = bare_endpoint();
  ibv_comp_channel* channel = v.create_comp_channel(e.ctx);
  ASSERT_NE(channel, nullptr);
  ASSERT_EQ(::close(channel->fd), 0);  // the channel owns it: ibv_destroy_comp_channel closes it
  EXPECT_EQ(v.destroy_comp_channel(channel), 0);
  EXPECT_EQ(provider.misuses(), 1U);
  EXPECT_NE(provider.last_misuse().find("ibv_destroy_comp_channel"), std::string::npos) << provider.last_misuse();
  expected_misuses = 1;
}

TEST_F(SoftVerbs, StatusAndEventStringsAreReadable) {
  EXPECT_STREQ(v.wc_status_str(IBV_WC_SUCCESS), "success");
  EXPECT_STREQ(v.wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error");
  EXPECT_STREQ(v.wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_STREQ(v.wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
  EXPECT_STREQ(v.event_type_str(IBV_EVENT_QP_FATAL), "local work queue catastrophic error");
  EXPECT_STREQ(v.event_type_str(IBV_EVENT_PORT_ACTIVE), "port active");
}

}  // namespace
