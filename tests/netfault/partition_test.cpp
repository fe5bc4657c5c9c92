// A partition between `corma serve` and `corma get` in the middle of a
// fetch, both ways or one way only, over chunks and over RDMA: one shorter
// than the lease is ridden out and the file arrives whole; one past the
// consumer's deadline fails the get with `timeout` within it, the owner
// lets go of the lease, stays up and bounded, and serves a new consumer at
// once when the link heals.
#include "netfault/faulted_fetch.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace corma::netfault {
namespace {

/// A partition of the issue's list: which way it cuts, and the path the
/// get in flight takes (chunks, or RDMA over UCX's tcp).
struct Partition {
  const char* name;
  Cut cut;
  bool rdma;
};

class PartitionedGet : public FetchUnderFaults, public ::testing::WithParamInterface<Partition> {
 protected:
  /// A 32 MiB get over a slow link, cut once the owner is sending it.
  Process start_cut_get(std::vector<std::string> serve_flags, const std::string& out) {
    link(LinkProfile{2500us, 0, 1000us, 0, 200'000'000});
    make_file(32u << 20);
    if (GetParam().rdma) serve_flags.push_back("--trusted-peers");
    serve(serve_flags);
    auto fetching = GetParam().rdma ? get_granted_rdma(out) : get_in_flight(out);
    EXPECT_TRUE(pair->partition(GetParam().cut));
    return fetching;
  }

  /// Starts an RDMA get and returns once the owner has granted it.
  Process get_granted_rdma(const std::string& out) {
    auto fetching = get(out, {"--trusted-peers"});
    const std::string granted = R"(corma_owner_decisions_total{path="rdma",reason="granted"})";
    const auto until = steady::now() + 20s;
    while (owner_metric(granted) < 1 && steady::now() < until) {
      if (fetching.wait_exit(1ms)) break;
    }
    EXPECT_EQ(owner_metric(granted), 1u) << "no RDMA grant:\n" << fetching.captured;
    return fetching;
  }
};

TEST_P(PartitionedGet, ShorterThanTheLeaseIsRiddenOut) {
  auto fetching = start_cut_get({"--lease-timeout", "5"}, "partitioned.out");
  std::this_thread::sleep_for(2s);  // the fault itself, not a wait for an event
  ASSERT_TRUE(pair->heal());
  const auto status = fetching.wait_exit(30s);
  ASSERT_TRUE(status) << "the get hung after the partition healed:\n" << fetching.captured;
  EXPECT_EQ(*status, 0) << fetching.captured;
  EXPECT_TRUE(read_file(base / "partitioned.out") == content);
  EXPECT_EQ(owner_metric("corma_owner_live_leases"), 0u) << "the get released its lease";
  expect_owner_alive_and_bounded();
}

TEST_P(PartitionedGet, PastTheDeadlineFailsTheGetInBoundAndTheOwnerLetsGo) {
  auto fetching = start_cut_get({"--lease-timeout", "2", "--io-timeout", "2"}, "cut.out");
  const auto cut = steady::now();
  // The consumer's deadline for each request and transfer is 10 s
  // (ConsumerConfig::io_timeout); an RDMA read that misses it falls back to
  // chunks once, whose first pull misses it again.
  const auto bound = GetParam().rdma ? 25s : 15s;
  const auto status = fetching.wait_exit(bound);
  const auto failed_after = steady::now() - cut;
  ASSERT_TRUE(status) << "the get outlived its bound:\n" << fetching.captured;
  std::cout << "[          ] " << GetParam().name << ": the get failed "
            << std::chrono::duration_cast<std::chrono::milliseconds>(failed_after).count() << " ms after the cut\n";
  EXPECT_EQ(*status, 1) << fetching.captured;
  EXPECT_NE(fetching.captured.find("timeout"), std::string::npos) << fetching.captured;
  EXPECT_GT(failed_after, 8s) << "failed before its deadline:\n" << fetching.captured;
  EXPECT_FALSE(std::filesystem::exists(base / "cut.out")) << "a failed get leaves no partial file";
  // The owner, partitioned too, gave the lease up past its lease timeout.
  EXPECT_EQ(owner_metric("corma_owner_live_leases"), 0u);
  expect_owner_alive_and_bounded();

  ASSERT_TRUE(pair->heal());
  const auto again = fetch_whole("after.out", GetParam().rdma ? std::vector<std::string>{"--trusted-peers"}
                                                              : std::vector<std::string>{});
  EXPECT_LT(again.took, 5s) << "the healed owner serves a new consumer at once";
}

INSTANTIATE_TEST_SUITE_P(Cuts, PartitionedGet,
                         ::testing::Values(Partition{"both_ways_chunked", Cut::both_ways, false},
                                           Partition{"to_owner_only_chunked", Cut::to_owner_only, false},
                                           Partition{"to_consumer_only_chunked", Cut::to_consumer_only, false},
                                           Partition{"both_ways_rdma", Cut::both_ways, true}),
                         [](const auto& named) { return std::string(named.param.name); });

TEST_F(FetchUnderFaults, ATwentySecondCutLongerThanTheLeaseEndsTheGetAndLeavesTheOwnerFree) {
  // The owner's defaults: a 10 s lease, a 10 s io timeout.
  link(LinkProfile{2500us, 0, 1000us, 0, 200'000'000});
  make_file(32u << 20);
  serve({});
  auto fetching = get_in_flight("cut.out");
  ASSERT_TRUE(pair->partition(Cut::both_ways));
  const auto cut = steady::now();
  const auto status = fetching.wait_exit(15s);
  ASSERT_TRUE(status) << "the get outlived its deadline:\n" << fetching.captured;
  EXPECT_EQ(*status, 1) << fetching.captured;
  EXPECT_NE(fetching.captured.find("timeout"), std::string::npos) << fetching.captured;
  // The rest of the 20 s: the lease (10 s past the last pull) runs out
  // while the owner still cannot reach the consumer.
  std::this_thread::sleep_until(cut + 20s);  // the fault itself, not a wait for an event
  EXPECT_EQ(owner_metric("corma_owner_live_leases"), 0u) << "the owner still holds the lease of a consumer that gave up";
  expect_owner_alive_and_bounded();
  ASSERT_TRUE(pair->heal());
  const auto again = fetch_whole("after.out", {});
  EXPECT_LT(again.took, 5s) << "the healed owner serves a new consumer at once";
}

}  // namespace
}  // namespace corma::netfault
