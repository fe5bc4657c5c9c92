// etcd killed and started again while consumers fetch through the
// directory: no fetch fails or returns wrong bytes, resolutions come from
// the cache while etcd is away (and are counted as stale), the consumer's
// watch comes back with etcd, and a withdrawal after the restart still
// reaches the consumer (nothing the broken watch missed is trusted).
#include "directory/announced_owner.hpp"

#include <corma/cluster_consumer.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace {

namespace asio = boost::asio;
using corma::testing::AnnouncedOwner;

/// Consumers fetching "obj" over and over until told to stop, counting
/// what they got.
struct Load {
  std::size_t running = 0;
  bool stopping = false;
  std::size_t fetched = 0;  ///< byte-exact successes
  std::size_t failed = 0;
  std::size_t wrong_bytes = 0;
  std::size_t failovers = 0;  ///< successes that first tried another owner
  std::map<std::string, std::size_t> served_by;
  std::string last_error;

  asio::awaitable<void> consume(corma::ClusterConsumer& cluster, const std::vector<std::byte>& expected) {
    ++running;
    std::vector<std::byte> into;
    while (!stopping) {
      into.assign(expected.size(), std::byte{0});
      corma::StreamDestination destination{[&into](std::uint64_t offset, std::span<const std::byte> chunk) {
                                             std::copy(chunk.begin(), chunk.end(),
                                                       into.begin() + static_cast<std::ptrdiff_t>(offset));
                                             return corma::success();
                                           },
                                           {}};
      auto outcome = co_await cluster.async_fetch_to("obj", std::move(destination));
      if (!outcome) {
        ++failed;
        last_error = outcome.error().message();
      } else if (into != expected) {
        ++wrong_bytes;
      } else {
        ++fetched;
        ++served_by[outcome.value().owner];
        if (!outcome.value().failed.empty()) ++failovers;
      }
    }
    --running;
  }
};

/// Waits, polling, until `done()` holds; false when `limit` passed first
/// (etcd's restart and the watch's return have no event to wait on here).
template <class Done>
asio::awaitable<bool> until(Done done, std::chrono::milliseconds limit) {
  auto executor = co_await asio::this_coro::executor;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) co_return false;
    asio::steady_timer pause(executor, std::chrono::milliseconds(5));
    co_await pause.async_wait(asio::use_awaitable);
  }
  co_return true;
}

class EtcdOutageTest : public corma::testing::ClusterTest {};

TEST_F(EtcdOutageTest, EtcdKilledAndRestartedUnderLoadCostsNoFetchAndTheWatchResumes) {
  AnnouncedOwner primary(io, config(), "owner-primary", 1, bytes);
  AnnouncedOwner replica(io, config(), "owner-replica", 7, bytes);
  ASSERT_TRUE(primary.announced);
  ASSERT_TRUE(replica.announced);
  auto directory = std::make_shared<corma::Directory>(io.get_executor(), config());
  corma::ClusterConsumer cluster(io.get_executor(), directory, nullptr);
  Load load;
  constexpr int consumers = 4;
  constexpr auto bound = std::chrono::seconds(10);

  corma::testing::run(
      io,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < consumers; ++i) asio::co_spawn(io, load.consume(cluster, bytes), asio::detached);
        EXPECT_TRUE(co_await until([&] { return load.fetched >= 20 && directory->stats().watching; }, bound))
            << "fetches before the outage: " << load.fetched;

        etcd.stop();
        EXPECT_TRUE(co_await until([&] { return !directory->stats().watching; }, bound))
            << "the consumer noticed its watch gone";
        const auto before_outage = load.fetched;
        EXPECT_TRUE(co_await until([&] { return load.fetched >= before_outage + 40; }, bound))
            << "fetches while etcd is down: " << load.fetched - before_outage;
        EXPECT_GT(directory->stats().stale_resolutions, 0u) << "answers from the cache are counted as such";
        EXPECT_GT(directory->stats().etcd_failures, 0u);

        EXPECT_TRUE(etcd.start()) << "etcd came back on its ports and data";
        // The owners' leases outlived the outage (or were granted again):
        // a directory that never saw them resolves both.
        corma::Directory fresh(io.get_executor(), config());
        auto both = co_await fresh.async_resolve("obj");
        EXPECT_TRUE(both && both.value().size() == 2u) << (both ? "one owner" : both.error().message());

        // Withdrawn before the consumer's watch is back: the primary still
        // serves, so only the directory can move the fetches off it, and
        // only if the delete made while the watch was down is not lost.
        const auto replica_before = load.served_by["owner-replica"];
        auto withdrawn = co_await primary.directory.async_withdraw();
        EXPECT_TRUE(withdrawn) << withdrawn.error().message();
        EXPECT_TRUE(co_await until([&] { return directory->stats().watching; }, bound))
            << "the watch is established again";
        EXPECT_TRUE(co_await until([&] { return load.served_by["owner-replica"] >= replica_before + 20; }, bound))
            << "fetches moved to the replica";
        const auto primary_after = load.served_by["owner-primary"];
        const auto replica_after = load.served_by["owner-replica"];
        EXPECT_TRUE(co_await until([&] { return load.served_by["owner-replica"] >= replica_after + 20; }, bound));
        EXPECT_EQ(load.served_by["owner-primary"], primary_after) << "a withdrawn owner is chosen no more";

        load.stopping = true;
        EXPECT_TRUE(co_await until([&] { return load.running == 0; }, bound));
      }(),
      std::chrono::seconds(60));

  EXPECT_EQ(load.failed, 0u) << load.last_error;
  EXPECT_EQ(load.wrong_bytes, 0u);
  EXPECT_EQ(load.failovers, 0u) << "no owner was lost, so no fetch had to fail over";
}

}  // namespace
