// A directory the size of a small cluster, in a real etcd: 50 owners
// announce 10,000 names, each name on three of them. A consumer resolves
// the whole set in one pass (a transaction per 128 names, not a request per
// name), every name to exactly its three owners, and single resolutions are
// timed cached and uncached. The figures are printed and recorded as test
// properties; what is asserted is that every answer is right and that the
// pass costs what it says.
#include "directory/etcd_server.hpp"
#include "support/run.hpp"

#include <corma/directory.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <set>

#include "directory/etcd_client.hpp"

namespace {

namespace asio = boost::asio;
using steady = std::chrono::steady_clock;

constexpr std::size_t owners = 50;
constexpr std::size_t names = 10000;
constexpr std::size_t replicas = 3;

std::string name_of(std::size_t i) { return "kv/block-" + std::to_string(i); }
std::string owner_of(std::size_t k) { return "owner-" + std::to_string(k); }

/// The owners of name i: three consecutive owners, starting where i falls.
std::set<std::string> owners_of(std::size_t i) {
  std::set<std::string> ids;
  for (std::size_t r = 0; r < replicas; ++r) ids.insert(owner_of((i + r) % owners));
  return ids;
}

double micros(steady::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(DirectoryScale, FiftyOwnersTenThousandNamesResolveInOnePassEachToItsReplicas) {
  if (auto missing = corma::testing::EtcdServer::missing()) GTEST_SKIP() << *missing;
  corma::testing::EtcdServer etcd;
  ASSERT_TRUE(etcd.start()) << "etcd did not start";
  asio::io_context io;
  auto config = etcd.config("/scale");
  config.machine = "consumer-host";

  std::vector<std::unique_ptr<corma::Directory>> announcing;
  const auto announce_start = steady::now();
  for (std::size_t k = 0; k < owners; ++k) {
    corma::Announcement a;
    a.owner = corma::OwnerEntry{owner_of(k), "127.0.0.1", static_cast<std::uint16_t>(5000 + k), "host-" + owner_of(k),
                                "tcp", 3, 0};
    // Owner k serves the names whose three owners include it.
    for (std::size_t i = 0; i < names; ++i) {
      if (owners_of(i).contains(owner_of(k))) a.names.push_back(name_of(i));
    }
    a.ttl = std::chrono::seconds(30);
    announcing.push_back(std::make_unique<corma::Directory>(io.get_executor(), config));
    auto announced = corma::testing::run(io, announcing.back()->async_announce(std::move(a)));
    ASSERT_TRUE(announced) << announced.error().message();
  }
  const auto announce_time = steady::now() - announce_start;

  // One pass over the whole set, nothing cached, read under a live watch
  // (what is read before the watch is live is trusted for cache_ttl only).
  auto watched = config;
  watched.cache_ttl = std::chrono::milliseconds(0);  // only what the watch vouches for is cached
  corma::Directory consumer(io.get_executor(), watched);
  const auto watch_deadline = steady::now() + std::chrono::seconds(5);
  while (!consumer.stats().watching && steady::now() < watch_deadline) {
    (void)corma::testing::run(io, consumer.async_resolve("not-announced"));
    asio::steady_timer pause(io, std::chrono::milliseconds(20));
    corma::testing::run(io, pause.async_wait(asio::use_awaitable));
  }
  ASSERT_TRUE(consumer.stats().watching) << "the watch never became live";
  std::vector<std::string> all;
  for (std::size_t i = 0; i < names; ++i) all.push_back(name_of(i));
  const auto requests_before = consumer.stats().etcd_requests;
  const auto pass_start = steady::now();
  auto resolved = corma::testing::run(io, consumer.async_resolve_many(all));
  const auto pass_time = steady::now() - pass_start;
  ASSERT_TRUE(resolved) << resolved.error().message();
  ASSERT_EQ(resolved.value().size(), names);
  for (std::size_t i = 0; i < names; ++i) {
    const auto& one = resolved.value()[i];
    ASSERT_TRUE(one) << name_of(i) << ": " << one.error().message();
    std::set<std::string> ids;
    for (const auto& o : one.value()) ids.insert(o.id);
    ASSERT_EQ(ids, owners_of(i)) << name_of(i);
  }
  // The names and the two shared families (prefixes, owners), 128 ranges
  // to a transaction.
  const auto families = names + 2;
  const auto transactions = (families + corma::directory::max_txn_ops - 1) / corma::directory::max_txn_ops;
  EXPECT_LE(consumer.stats().etcd_requests - requests_before, transactions + 1)
      << "a set is not resolved in one pass";

  // The same set again: every family was read under the live watch and
  // nothing changed since, so etcd is not asked.
  const auto cached_requests = consumer.stats().etcd_requests;
  const auto cached_start = steady::now();
  auto again = corma::testing::run(io, consumer.async_resolve_many(all));
  const auto cached_pass = steady::now() - cached_start;
  ASSERT_TRUE(again);
  EXPECT_EQ(consumer.stats().etcd_requests, cached_requests);

  // Single resolutions: a sample, cached (the consumer above) and uncached
  // (a consumer whose cache never holds).
  auto cold_config = config;
  cold_config.cache_ttl = std::chrono::milliseconds(0);
  cold_config.watch = false;
  corma::Directory cold(io.get_executor(), cold_config);
  std::vector<double> cached_us, uncached_us;
  for (std::size_t i = 0; i < names; i += 50) {
    auto t0 = steady::now();
    ASSERT_TRUE(corma::testing::run(io, consumer.async_resolve(name_of(i))));
    cached_us.push_back(micros(steady::now() - t0));
    t0 = steady::now();
    auto one = corma::testing::run(io, cold.async_resolve(name_of(i)));
    uncached_us.push_back(micros(steady::now() - t0));
    ASSERT_TRUE(one) << one.error().message();
    ASSERT_EQ(one.value().size(), replicas);
  }

  const auto report = [&](const char* key, double value) {
    ::testing::Test::RecordProperty(key, std::to_string(value));
    std::printf("  %-34s %12.1f\n", key, value);
  };
  std::printf("directory of %zu owners, %zu names, %zu replicas each:\n", owners, names, replicas);
  report("announce_all_ms", micros(announce_time) / 1000);
  report("resolve_set_uncached_ms", micros(pass_time) / 1000);
  report("resolve_set_uncached_us_per_name", micros(pass_time) / names);
  report("resolve_set_cached_us_per_name", micros(cached_pass) / names);
  report("resolve_one_cached_median_us", median(cached_us));
  report("resolve_one_uncached_median_us", median(uncached_us));
}

}  // namespace
