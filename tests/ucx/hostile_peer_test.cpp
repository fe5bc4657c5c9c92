// A peer that drives raw UCX against a corma UCX backend over tcp, trying to
// read memory the owner never registered. With the default trust setting the
// owner makes no peer and has no tcp interface to reach; with trusted_peers
// the peer reads it — the risk that setting's documentation states.
#include <corma/ucx.hpp>

#include "wire.hpp"

#include <ucp/api/ucp.h>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace ucx = corma::ucx;

/// A raw UCX worker with RMA, holding an endpoint to the victim.
class Attacker {
 public:
  Attacker() {
    ucp_config_t* config = nullptr;
    ucp_config_read(nullptr, nullptr, &config);
    ucp_config_modify(config, "TLS", "tcp");
    ucp_config_modify(config, "NET_DEVICES", "lo");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    EXPECT_EQ(ucp_init(&params, config, &context_), UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    EXPECT_EQ(ucp_worker_create(context_, &worker_params, &worker_), UCS_OK);
  }

  ~Attacker() {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    if (ep_ != nullptr) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* closing = ucp_ep_close_nbx(ep_, &param);
      while (closing != nullptr && !UCS_PTR_IS_ERR(closing) &&
             ucp_request_check_status(closing) == UCS_INPROGRESS) {
        ucp_worker_progress(worker_);
      }
      if (closing != nullptr && !UCS_PTR_IS_ERR(closing)) ucp_request_free(closing);
    }
    if (pending_ != nullptr) ucp_request_free(pending_);
    if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }

  void connect(const std::vector<std::byte>& answer) {
    auto address = ucx::wire::decode_address(answer).value().address;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ASSERT_EQ(ucp_ep_create(worker_, &params, &ep_), UCS_OK);
    // Software-emulated RMA needs no key from the victim: a key for the
    // attacker's own memory will do.
    ucp_mem_map_params_t map{};
    map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    map.address = own_.data();
    map.length = own_.size();
    ASSERT_EQ(ucp_mem_map(context_, &map, &memh_), UCS_OK);
    void* packed = nullptr;
    std::size_t packed_size = 0;
    ASSERT_EQ(ucp_rkey_pack(context_, memh_, &packed, &packed_size), UCS_OK);
    ASSERT_EQ(ucp_ep_rkey_unpack(ep_, packed, &rkey_), UCS_OK);
    ucp_rkey_buffer_release(packed);
  }

  /// Tries to read `len` bytes at `address` of the victim; gives the victim
  /// `window` to answer (an observation window: a refusal has no event).
  std::vector<char> read(const void* address, std::size_t len, std::chrono::milliseconds window) {
    std::vector<char> out(len, 0);
    ucp_request_param_t param{};
    void* request = ucp_get_nbx(ep_, out.data(), len, reinterpret_cast<std::uint64_t>(address), rkey_, &param);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) return out;
    const auto until = std::chrono::steady_clock::now() + window;
    while (ucp_request_check_status(request) == UCS_INPROGRESS && std::chrono::steady_clock::now() < until) {
      ucp_worker_progress(worker_);
    }
    if (ucp_request_check_status(request) == UCS_INPROGRESS) {
      pending_ = request;  // never answered: freed after the endpoint is forced closed
    } else {
      ucp_request_free(request);
    }
    return out;
  }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  void* pending_ = nullptr;
  std::vector<char> own_ = std::vector<char>(4096);
};

TEST(UcxHostilePeer, DefaultTrustGivesNothingToConnectTo) {
  auto victim = ucx::Backend::create({.transport = ucx::Transport::tcp}).value();
  // The offer a corma reader sends: the victim would answer it with its
  // worker address, but untrusted tcp makes no peers (and has no tcp
  // interface: see UcxListening).
  auto answer = victim->async_peer_accept(ucx::wire::encode_offer(), asio::use_future).get();
  ASSERT_FALSE(answer);
  EXPECT_TRUE(answer.error().is(corma::errc::not_configured)) << answer.error().message();
}

TEST(UcxHostilePeer, TrustedPeersCanReadAnyAddress) {
  const std::vector<char> secret(4096, 'S');  // never registered
  auto victim = ucx::Backend::create({.transport = ucx::Transport::tcp, .trusted_peers = true, .tcp_interface = "lo"})
                    .value();
  Attacker attacker;
  auto answer = victim->async_peer_accept(ucx::wire::encode_offer(), asio::use_future).get();
  ASSERT_TRUE(answer) << answer.error().message();
  attacker.connect(answer.value().blob);
  const auto stolen = attacker.read(secret.data(), 64, std::chrono::milliseconds(500));
  ASSERT_EQ(stolen.size(), 64u);
  // This is the documented risk of trusted_peers, shown, not a wish.
  EXPECT_EQ(std::count(stolen.begin(), stolen.end(), 'S'), 64);
}

}  // namespace
