// The verbs backend beyond the shared contract, over the software provider:
// opening (and refusing to open) devices, chunking into work requests,
// send-queue back-pressure, completion faults, queue pairs in error, async
// events, registration failures surfacing through the Registry, and access
// flags enforced by the "NIC".
#include "verbs/backend_fixture.hpp"

#include "device.hpp"
#include "wire.hpp"

#include <corma/registry.hpp>

#include <cerrno>
#include <numeric>

namespace corma::verbs {
namespace {

using testing::SoftVerbsConfig;
using namespace std::chrono_literals;

// ---- opening a device ------------------------------------------------------

TEST_F(VerbsBackend, AKernelWithoutRdmaIsNotConfiguredAndSaysSo) {
  fabric.reset(SoftVerbsConfig{.no_kernel_support = true});
  auto backend = corma::verbs::create_over({}, fabric.api());
  ASSERT_FALSE(backend);
  EXPECT_TRUE(backend.error().is(errc::not_configured));
  EXPECT_NE(backend.error().detail.find("ENOSYS"), std::string::npos) << backend.error().message();
}

TEST_F(VerbsBackend, NoDeviceOrAnUnknownNameIsNotConfigured) {
  fabric.reset(SoftVerbsConfig{.device_count = 0});
  auto none = corma::verbs::create_over({}, fabric.api());
  ASSERT_FALSE(none);
  EXPECT_TRUE(none.error().is(errc::not_configured));
  EXPECT_NE(none.error().detail.find("no RDMA device"), std::string::npos) << none.error().message();

  fabric.reset();
  Config named;
  named.device = "mlx5_9";
  auto unknown = corma::verbs::create_over(named, fabric.api());
  ASSERT_FALSE(unknown);
  EXPECT_TRUE(unknown.error().is(errc::not_configured));
  EXPECT_NE(unknown.error().detail.find("soft0"), std::string::npos) << "should list what exists";
  EXPECT_EQ(fabric.open_contexts(), 0u) << "a refused start leaves nothing open";
}

TEST_F(VerbsBackend, AnIncompleteFunctionTableIsNotConfigured) {
  auto partial = std::make_shared<IbvApi>(*fabric.api());
  partial->post_send = nullptr;
  auto backend = corma::verbs::create_over({}, partial);
  ASSERT_FALSE(backend);
  EXPECT_TRUE(backend.error().is(errc::not_configured));
  EXPECT_NE(backend.error().detail.find("post_send"), std::string::npos) << backend.error().message();
}

TEST_F(VerbsBackend, TheRealLibraryOpensADeviceOrSaysWhyNot) {
  auto backend = Backend::create(Config{});
  if (backend) {
    std::cout << "[          ] opened " << backend.value()->device_name() << '\n';
    SUCCEED();
  } else {
    std::cout << "[          ] " << backend.error().message() << '\n';
    EXPECT_TRUE(backend.error().is(errc::not_configured)) << backend.error().message();
    EXPECT_FALSE(backend.error().detail.empty());
  }
}

/// A RoCE port whose GID table holds a RoCE v1 entry, an empty slot, then
/// RoCE v2 entries.
SoftVerbsConfig roce_port() {
  ibv_gid v1{}, v2{}, v2_other{};
  v1.raw[15] = 1;
  v2.raw[10] = 0xff;
  v2.raw[11] = 0xff;
  v2.raw[15] = 2;
  v2_other = v2;
  v2_other.raw[15] = 3;
  return SoftVerbsConfig{.link_layer = IBV_LINK_LAYER_ETHERNET,
                         .gids = {{v1, IBV_GID_TYPE_ROCE_V1},
                                  {ibv_gid{}, IBV_GID_TYPE_ROCE_V2},
                                  {v2, IBV_GID_TYPE_ROCE_V2},
                                  {v2_other, IBV_GID_TYPE_ROCE_V2}}};
}

TEST_F(VerbsBackend, RoceChoosesTheFirstRoceV2GidUnlessOneIsConfigured) {
  fabric.reset(roce_port());
  const auto api = fabric.api();
  auto automatic = open_device(*api, Config{});
  ASSERT_TRUE(automatic) << automatic.error().message();
  EXPECT_EQ(automatic.value().gid_index, 2);
  EXPECT_EQ(automatic.value().gid.raw[15], 2);
  automatic.value().context.reset();  // closed by its owner

  Config pinned;
  pinned.gid_index = 3;
  auto configured = open_device(*api, pinned);
  ASSERT_TRUE(configured) << configured.error().message();
  EXPECT_EQ(configured.value().gid_index, 3);
  configured.value().context.reset();

  // InfiniBand routes by LID: no GID unless one is asked for.
  fabric.reset();
  auto infiniband = open_device(*api, Config{});
  ASSERT_TRUE(infiniband) << infiniband.error().message();
  EXPECT_EQ(infiniband.value().gid_index, -1);
  infiniband.value().context.reset();
  EXPECT_EQ(fabric.open_contexts(), 0u);
}

TEST_F(VerbsBackend, RoceAddressesByARoceV2GidAndMovesBytes) {
  fabric.reset(roce_port());
  const auto l = link(8192, 3);
  auto r = l.get(8192);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(l.sink, l.source);
}

TEST_F(VerbsBackend, RegistrationReportsPageRoundedRangeAndLeastAccess) {
  auto backend = make();
  const auto own_mrs = fabric.live_mrs();  // the engine's atomic scratch area
  EXPECT_EQ(own_mrs, 1u);
  EXPECT_EQ(backend->live_registrations(), 0u) << "the scratch area is not a caller's registration";
  std::vector<std::byte> memory(10000);
  auto local = map(*backend, memory, Access::local);
  EXPECT_TRUE(local.packed_key.empty()) << "local-only memory gets no key";
  EXPECT_LE(local.effective_addr, reinterpret_cast<std::uint64_t>(memory.data()));
  EXPECT_GE(local.effective_addr + local.effective_len, reinterpret_cast<std::uint64_t>(memory.data()) + 10000);
  EXPECT_EQ(local.effective_addr % 4096, 0u);
  EXPECT_EQ(local.effective_len % 4096, 0u);
  auto exported = map(*backend, memory, Access::remote_read);
  auto key = wire::decode_key(exported.packed_key);
  ASSERT_TRUE(key);
  EXPECT_EQ(key.value().addr, reinterpret_cast<std::uint64_t>(memory.data()));
  EXPECT_EQ(key.value().len, memory.size());
  EXPECT_EQ(key.value().access, Access::remote_read);
  EXPECT_EQ(fabric.live_mrs(), own_mrs + 2);
  EXPECT_TRUE(answered(backend->async_unmap(local.id, asio::use_future)));
  EXPECT_TRUE(answered(backend->async_unmap(exported.id, asio::use_future)));
  EXPECT_EQ(fabric.live_mrs(), own_mrs);
  EXPECT_EQ(backend->live_registrations(), 0u);
}

// ---- chunking and back-pressure ------------------------------------------

TEST_F(VerbsBackend, ATransferOfTwoAndAHalfMaxMessagesPostsThreeWorkRequests) {
  constexpr std::uint32_t max_msg = 64 * 1024;
  fabric.reset(SoftVerbsConfig{.max_msg_sz = max_msg});
  constexpr std::size_t len = max_msg * 5 / 2;
  auto l = link(len, 7, Access::remote_read_write);
  ASSERT_EQ(l.a->max_message_size(), max_msg);

  const auto before = fabric.work_requests_posted();
  auto r = l.get(len);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(fabric.work_requests_posted() - before, 3u);
  EXPECT_EQ(l.sink, l.source);

  const auto fresh = pattern(len, 99);
  std::copy(fresh.begin(), fresh.end(), l.sink.begin());  // the registered buffer itself
  PutRequest put{l.peer, l.local.id, 0, address(l.source), len, l.remote.packed_key};
  auto p = answered(l.a->async_put(std::move(put), asio::use_future));
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(fabric.work_requests_posted() - before, 6u);
  EXPECT_EQ(l.source, fresh);
}

TEST_F(VerbsBackend, TenTimesTheSendQueueDepthAllCompleteWithoutAnOverrun) {
  constexpr std::uint32_t depth = 8;
  constexpr std::size_t count = 10 * depth;
  constexpr std::size_t slice = 256;
  const auto l = shallow_link(depth, count * slice, 5);

  fabric.hold_work();  // everything is issued before anything completes
  std::vector<std::future<Result<void>>> gets;
  for (std::size_t i = 0; i < count; ++i) gets.push_back(l.start_get(i, slice));
  ASSERT_TRUE(fabric.wait_until([&] { return fabric.work_requests_executing_or_queued() == depth; }, 5s))
      << "the backend should post exactly a queue's worth and keep the rest";
  fabric.release_work();
  for (std::size_t i = 0; i < count; ++i) {
    auto r = answered(std::move(gets[i]));
    EXPECT_TRUE(r) << i << ": " << r.error().message();
  }
  EXPECT_EQ(l.sink, l.source);
  EXPECT_EQ(fabric.overruns(), 0u);
  EXPECT_LE(fabric.max_outstanding(), depth);
  EXPECT_EQ(fabric.work_requests_posted(), count);
}

TEST_F(VerbsBackend, ABatchIsPostedAsChainedWorkRequestsWithinTheSendQueueDepth) {
  constexpr std::uint32_t depth = 8;
  constexpr std::size_t count = 5 * depth;
  constexpr std::size_t slice = 256;
  const auto l = shallow_link(depth, count * slice, 9);
  TransferBatch batch;
  for (std::size_t i = 0; i < count; ++i) batch.push_back(l.slice(i, slice));

  fabric.hold_work();  // nothing completes, so the first post shows the chain
  const auto calls_before = fabric.post_send_calls();
  const auto posted_before = fabric.work_requests_posted();
  auto outcome = l.a->async_get_batch(std::move(batch), asio::use_future);
  ASSERT_TRUE(fabric.wait_until([&] { return fabric.work_requests_executing_or_queued() == depth; }, 5s))
      << "the batch should fill the send queue and keep the rest";
  EXPECT_EQ(fabric.post_send_calls() - calls_before, 1u) << "a queue's worth of elements should go in one post";
  fabric.release_work();
  auto done = answered(std::move(outcome));
  ASSERT_TRUE(done) << done.error().message();
  EXPECT_TRUE(done.value().all_succeeded());
  EXPECT_EQ(l.sink, l.source);
  EXPECT_LE(fabric.max_outstanding(), depth);
  EXPECT_EQ(fabric.work_requests_posted() - posted_before, count);
}

// ---- faults ----------------------------------------------------------------

TEST_F(VerbsBackend, ARemoteAccessErrorFailsThatTransferOnly) {
  const auto faulty = link(4096, 1);
  const auto healthy = link(4096, 2);

  fabric.hold_work();
  fabric.fail_next_completion(IBV_WC_REM_ACCESS_ERR);
  auto failed = faulty.start_get(0, 4096);
  ASSERT_TRUE(fabric.wait_until([&] { return fabric.work_requests_executing_or_queued() == 1; }, 5s));
  auto fine = healthy.start_get(0, 4096);
  ASSERT_TRUE(fabric.wait_until([&] { return fabric.work_requests_executing_or_queued() == 2; }, 5s));
  fabric.release_work();

  auto r = answered(std::move(failed));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::backend)) << r.error().message();
  EXPECT_EQ(r.error().cause.category(), completion_category());
  EXPECT_EQ(r.error().cause.value(), IBV_WC_REM_ACCESS_ERR);
  EXPECT_FALSE(r.error().cause.message().empty());
  auto ok = answered(std::move(fine));
  EXPECT_TRUE(ok) << ok.error().message();
  EXPECT_EQ(healthy.sink, healthy.source);

  // The faulted queue pair is in the error state: that peer is broken, and says so.
  auto later = faulty.get(4096);
  ASSERT_FALSE(later);
  EXPECT_TRUE(later.error().is(errc::peer_unreachable)) << later.error().message();
  EXPECT_TRUE(healthy.get(4096));
}

TEST_F(VerbsBackend, AQueuePairInErrorFailsItsInFlightWorkAndThePeerIsUnreachable) {
  const auto l = link(4 * 4096, 4);
  fabric.hold_work();
  std::vector<std::future<Result<void>>> gets;
  for (std::uint64_t i = 0; i < 4; ++i) gets.push_back(l.start_get(i, 4096));
  ASSERT_TRUE(fabric.wait_until([&] { return fabric.work_requests_executing_or_queued() == 4; }, 5s));
  fabric.move_qps_to_error();
  fabric.release_work();
  for (auto& g : gets) {
    auto r = answered(std::move(g));
    ASSERT_FALSE(r);
    EXPECT_TRUE(r.error().is(errc::peer_unreachable)) << r.error().message();
  }
  EXPECT_EQ(l.a->transfers_in_flight(), 0u);
  auto later = l.get(4096);
  ASSERT_FALSE(later);
  EXPECT_TRUE(later.error().is(errc::peer_unreachable)) << later.error().message();
  // The region those transfers pinned is free to go.
  EXPECT_TRUE(answered(l.a->async_unmap(l.local.id, asio::use_future)));
  EXPECT_EQ(l.a->live_registrations(), 0u);
}

TEST_F(VerbsBackend, AFatalQueuePairEventBreaksThePeer) {
  const auto l = link(4096, 6);
  ASSERT_TRUE(l.get(4096));

  fabric.raise_async_event(IBV_EVENT_QP_FATAL);
  // Each backend reads and acknowledges its event on its progress thread.
  ASSERT_TRUE(fabric.wait_until([&] { return fabric.unacked_async_events() == 0; }, 5s));
  ASSERT_TRUE(fabric.wait_until(
      [&] {
        auto r = l.get(4096);
        return !r && r.error().is(errc::peer_unreachable);
      },
      5s))
      << "transfers to a peer whose queue pair is fatal must answer peer_unreachable";
}

TEST_F(VerbsBackend, OutOfMemoryOnRegistrationIsABackendErrorAndReleasesTheBudget) {
  auto backend = make();
  Registry registry(backend, RegistryConfig{1 << 20, 0});
  std::vector<std::byte> memory(64 * 1024);
  fabric.fail_next_reg_mr(ENOMEM);
  auto refused = answered(registry.async_register(memory, Access::remote_read, asio::use_future));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::backend)) << refused.error().message();
  EXPECT_NE(refused.error().detail.find("ibv_reg_mr"), std::string::npos) << refused.error().message();
  const auto stats = registry.stats();
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.failed_backend, 1u);
  EXPECT_EQ(backend->live_registrations(), 0u);

  auto retried = answered(registry.async_register(memory, Access::remote_read, asio::use_future));
  ASSERT_TRUE(retried) << retried.error().message();
  EXPECT_GE(registry.stats().registered_bytes, 64u * 1024) << "the page-enclosing length is charged";
}

TEST_F(VerbsBackend, APutThroughAReadOnlyKeyIsRefusedBeforeItIsPosted) {
  const auto l = link(4096, 8);  // exported for remote read only
  const auto original = l.source;
  PutRequest put{l.peer, l.local.id, 0, address(l.source), 4096, l.remote.packed_key};
  auto r = answered(l.a->async_put(std::move(put), asio::use_future));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::not_owned)) << r.error().message();
  EXPECT_EQ(l.source, original) << "a refused put must not change a byte";
  // Refused on this side: the queue pair is still up for the next transfer.
  GetRequest get{l.peer, l.local.id, 0, address(l.source), 4096, l.remote.packed_key};
  EXPECT_TRUE(answered(l.a->async_get(std::move(get), asio::use_future)));
}

TEST_F(VerbsBackend, APutIntoMemoryExportedForReadOnlyIsRefusedByTheNic) {
  const auto l = link(4096, 8);  // exported for remote read only
  const auto original = l.source;
  // A key forged to claim remote write passes this side's check: the NIC's
  // access check is what stops the put.
  const auto rkey = fabric.rkey_of(l.source.data());
  ASSERT_TRUE(rkey.has_value());
  const auto forged = wire::encode_key({*rkey, address(l.source), l.source.size(), Access::remote_read_write});
  PutRequest put{l.peer, l.local.id, 0, address(l.source), 4096, forged};
  auto r = answered(l.a->async_put(std::move(put), asio::use_future));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().cause.value(), IBV_WC_REM_ACCESS_ERR) << r.error().message();
  EXPECT_EQ(l.source, original) << "a refused put must not change a byte";
}

TEST_F(VerbsBackend, AGetFromMemoryWithoutRemoteReadIsRefusedByTheNic) {
  const auto l = link(4096, 10, Access::local);  // registered, not exported
  // A peer that learned (or guessed) the rkey forges a key for it: the NIC's
  // access check is what stops it.
  const auto rkey = fabric.rkey_of(l.source.data());
  ASSERT_TRUE(rkey.has_value());
  const auto forged = wire::encode_key({*rkey, address(l.source), l.source.size()});
  GetRequest request{l.peer, l.local.id, 0, address(l.source), 4096, forged};
  auto r = answered(l.a->async_get(std::move(request), asio::use_future));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().cause.value(), IBV_WC_REM_ACCESS_ERR) << r.error().message();
  EXPECT_EQ(l.sink, std::vector<std::byte>(4096)) << "no secret byte may arrive";
}

TEST_F(VerbsBackend, ShutdownReleasesEveryProviderObject) {
  {
    auto a = make();
    auto b = make();
    connect(*a, *b);
    std::vector<std::byte> memory(4096);
    map(*a, memory, Access::remote_read);
    EXPECT_TRUE(answered(a->async_shutdown(asio::use_future)));
    EXPECT_EQ(a->live_registrations(), 0u);
  }
  EXPECT_EQ(fabric.leftovers(), "") << "objects left alive";
  EXPECT_EQ(fabric.misuses(), 0u);
}

}  // namespace
}  // namespace corma::verbs
