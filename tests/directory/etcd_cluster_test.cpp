// The directory over a real 3-member etcd cluster: the member an owner and
// its consumers talk to is killed while they work, and neither a fetch nor
// the announcement is lost (calls and the watch move to the next member).
#include "directory/announced_owner.hpp"
#include "support/etcd_cluster.hpp"

#include <corma/cluster_consumer.hpp>

#include <gtest/gtest.h>

#include <algorithm>

namespace {

using corma::testing::AnnouncedOwner;
using corma::testing::EtcdCluster;
using namespace std::chrono_literals;

TEST(DirectoryOverAnEtcdCluster, AMemberKilledUnderLoadCostsNoFetchAndNoAnnouncement) {
  if (auto missing = corma::testing::EtcdProcess::missing()) GTEST_SKIP() << *missing;
  EtcdCluster etcd;
  ASSERT_TRUE(etcd.start()) << etcd.output();
  boost::asio::io_context io;
  std::vector<std::byte> bytes(64 * 1024);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7 + 1);
  // A lease of 1 s: the owner's entries outlive the killed member only if
  // its renewals move to another.
  AnnouncedOwner owner(io, etcd.config("/cluster"), "owner-1", 0, bytes, {}, 1s);
  ASSERT_TRUE(owner.announced) << owner.announced.error().message();

  auto asking = etcd.config("/cluster");  // every resolution asks etcd
  asking.watch = false;
  asking.cache_ttl = 0ms;
  auto watching = etcd.config("/cluster");  // a cache kept by the watch
  watching.cache_ttl = 0ms;
  auto asking_directory = std::make_shared<corma::Directory>(io.get_executor(), asking);
  auto watching_directory = std::make_shared<corma::Directory>(io.get_executor(), watching);
  corma::ClusterConsumer by_asking(io.get_executor(), asking_directory, nullptr);
  corma::ClusterConsumer by_watching(io.get_executor(), watching_directory, nullptr);
  auto fetch_from = [&](corma::ClusterConsumer& cluster) {
    std::vector<std::byte> got(bytes.size());
    corma::StreamDestination into{[&got](std::uint64_t offset, std::span<const std::byte> chunk) {
                                    std::copy(chunk.begin(), chunk.end(), got.begin() + static_cast<std::ptrdiff_t>(offset));
                                    return corma::success();
                                  },
                                  {}};
    auto fetched = corma::testing::run(io, cluster.async_fetch_to("obj", std::move(into)));
    if (!fetched) ADD_FAILURE() << fetched.error().message();
    return fetched && got == bytes;
  };
  ASSERT_TRUE(fetch_from(by_asking));
  ASSERT_TRUE(fetch_from(by_watching));

  etcd.kill(0);  // the member every one of them talks to
  // Fetching for three lease lifetimes: each fetch resolves through etcd,
  // and the owner's entries are gone unless renewed elsewhere.
  const auto until = std::chrono::steady_clock::now() + 3s;
  std::size_t fetches = 0;
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(fetch_from(by_asking)) << "fetch " << fetches << " through the asking directory failed";
    ASSERT_TRUE(fetch_from(by_watching)) << "fetch " << fetches << " through the watching directory failed";
    ++fetches;
  }
  EXPECT_GT(fetches, 10u);
  EXPECT_EQ(owner.directory.stats().leases_granted, 1u) << "the lease lapsed and had to be granted again";
  // (While the other two elect a leader, if the killed one led, a
  // resolution may be answered from the cache: counted, and no fetch lost.)
  EXPECT_GT(asking_directory->stats().resolutions, asking_directory->stats().stale_resolutions + 10);
}

}  // namespace
