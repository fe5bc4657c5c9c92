// Owners found through the directory, across a faulty link: etcd and two
// owners of the same file in the owner's namespace, `corma get --directory`
// in the consumer's. When the owner serving the get is cut off from the
// consumer (its rendezvous port dropped both ways, its lease in etcd kept
// alive), the get fails over to the replica once its deadline passes, and
// the file still arrives byte for byte, saying which owner served it and
// which failed.
#include "netfault/faulted_fetch.hpp"
#include "support/etcd_process.hpp"

#include <gtest/gtest.h>

namespace corma::netfault {
namespace {

class DirectoryUnderPartition : public FetchUnderFaults {};

TEST_F(DirectoryUnderPartition, ACutOffOwnersReplicaTakesTheFetchOver) {
  if (auto missing = corma::testing::EtcdProcess::missing()) GTEST_SKIP() << *missing;
  link(LinkProfile{2500us, 0, 1000us, 0, 200'000'000});
  make_file(32u << 20);
  corma::testing::EtcdProcess etcd({tool("ip"), "netns", "exec", pair->name(Side::owner)},
                                   NetworkPair::address(Side::owner));
  ASSERT_TRUE(etcd.start()) << etcd.output();
  const auto directory = NetworkPair::address(Side::owner) + ":" + std::to_string(etcd.client_port());
  const std::vector<std::string> ids = {"owner-1", "owner-2"};
  std::vector<ServingOwner> owners;
  for (const auto& id : ids) {
    owners.push_back(start_owner({"--directory", directory, "--owner-id", id, "--announce-ttl", "2"}));
    ASSERT_TRUE(owners.back().process.wait_for_output("announced " + id)) << owners.back().process.captured;
  }

  auto fetching = pair->start_in(Side::consumer, {CORMA_BINARY, "get", "--directory", directory, "f.bin", "-o",
                                                  (base / "f.out").string(), "--no-rdma", "--pull-window", "1"});
  // Whichever owner the directory ranked first is serving it.
  std::optional<std::size_t> serving;
  const auto until = steady::now() + 20s;
  while (!serving && steady::now() < until && !fetching.wait_exit(1ms)) {
    for (std::size_t i = 0; i < owners.size(); ++i) {
      if (metric_of(owners[i], "corma_owner_pulls_total") >= 3) serving = i;
    }
  }
  ASSERT_TRUE(serving) << "no owner started serving:\n" << fetching.captured;
  ASSERT_TRUE(pair->partition(Cut::both_ways, owners[*serving].port));
  const auto cut = steady::now();

  // The consumer's deadline (10 s) ends the cut-off owner's fetch; the
  // replica then serves the whole file (32 MiB at 200 Mbit/s: 1.3 s).
  const auto status = fetching.wait_exit(25s);
  ASSERT_TRUE(status) << "the get did not finish after its owner was cut off:\n" << fetching.captured;
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - cut);
  std::cout << "[          ] the replica finished the get " << took.count() << " ms after the cut\n";
  EXPECT_EQ(*status, 0) << fetching.captured;
  EXPECT_TRUE(read_file(base / "f.out") == content);
  const auto& cut_off = ids[*serving];
  const auto& replica = ids[1 - *serving];
  EXPECT_NE(fetching.captured.find("from " + replica + " (" + cut_off + " failed"), std::string::npos)
      << fetching.captured;
  EXPECT_GT(metric_of(owners[1 - *serving], "corma_owner_pulls_total"), 0u) << "the replica served it";
}

}  // namespace
}  // namespace corma::netfault
