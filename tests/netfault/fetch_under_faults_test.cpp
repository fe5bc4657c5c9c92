// `corma serve` in one namespace and `corma get` in another, as separate
// processes, across a faulty link: at round trips of 1, 5 and 20 ms, with
// loss of 0.1, 1 and 5 % and with reordering, every path (RDMA over UCX's
// tcp, chunks) delivers the file byte for byte; a partition shorter than the lease is ridden out; one longer than
// the consumer's deadline fails the get with the documented error within
// it, the owner lets go of the lease, and serves a new consumer at once
// when the link heals. Speeds are printed beside a plain TCP stream of the
// same bytes over the same link (the bench holds the targets).
#include "netfault/network_pair.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <thread>

namespace corma::netfault {
namespace {

using namespace std::chrono_literals;
using cli::testing::metric;
using cli::testing::port_after;
using steady = std::chrono::steady_clock;

class FetchUnderFaults : public cli::testing::TempTree {
 protected:
  std::unique_ptr<NetworkPair> pair;
  std::vector<char> content;
  std::uint16_t owner_port = 0;
  std::uint16_t metrics_port = 0;

  void SetUp() override {
    if (auto why = NetworkPair::unavailable()) GTEST_SKIP() << *why;
    TempTree::SetUp();
  }

  void link(LinkProfile profile) {
    pair = std::make_unique<NetworkPair>(profile);
    ASSERT_TRUE(pair->ready()) << pair->why_not();
  }

  void make_file(std::size_t size) {
    content.resize(size);
    std::mt19937_64 random(7);
    for (std::size_t i = 0; i + 8 <= size; i += 8) {
      const auto word = random();
      std::memcpy(content.data() + i, &word, 8);
    }
    write_file(root / "f.bin", content);
  }

  Process serve(std::vector<std::string> extra) {
    std::vector<std::string> args = {CORMA_BINARY, "serve", "--root", root.string(), "--listen",
                                     NetworkPair::address(Side::owner) + ":0", "--metrics", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = pair->start_in(Side::owner, args);
    EXPECT_TRUE(server.wait_for_output("/metrics")) << server.captured;
    owner_port = static_cast<std::uint16_t>(std::stoi(port_after(server.captured, "listening on")));
    metrics_port = static_cast<std::uint16_t>(std::stoi(port_after(server.captured, "metrics on http://")));
    return server;
  }

  [[nodiscard]] std::uint64_t owner_metric(const std::string& name) const {
    return metric(http_get_in(*pair, Side::owner, metrics_port, "/metrics"), name);
  }

  Process get(const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {CORMA_BINARY, "get", NetworkPair::address(Side::owner) + ":" +
                                     std::to_string(owner_port), "f.bin", "-o", (base / out).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return pair->start_in(Side::consumer, args);
  }

  struct Fetched {
    steady::duration took{};  ///< the whole command, start to exit
    double mb_per_s = 0;      ///< the speed corma get reports (connection and fetch)
  };

  /// A get run to its end, after checking every byte.
  Fetched fetch_whole(const std::string& out, std::vector<std::string> extra) {
    const auto start = steady::now();
    auto fetching = get(out, std::move(extra));
    const auto status = fetching.wait_exit(60s);
    Fetched fetched{steady::now() - start};
    EXPECT_EQ(status.value_or(-1), 0) << fetching.captured;
    EXPECT_TRUE(read_file(base / out) == content) << out << " differs from the served file";
    const auto comma = fetching.captured.rfind(", ");
    if (comma != std::string::npos) fetched.mb_per_s = std::atof(fetching.captured.c_str() + comma + 2);
    EXPECT_GT(fetched.mb_per_s, 0) << "no speed in: " << fetching.captured;
    return fetched;
  }

  /// Prints each path's speed beside a plain TCP stream over the same link.
  void report(const std::string& profile, const std::vector<std::pair<std::string, Fetched>>& paths) {
    const auto stream = time_tcp_stream(*pair, content.size());
    ASSERT_TRUE(stream) << "the plain TCP stream did not arrive whole";
    const double stream_mb_per_s =
        static_cast<double>(content.size()) / std::chrono::duration<double>(*stream).count() / 1e6;
    std::cout << "[          ] " << profile << ": tcp stream " << stream_mb_per_s << " MB/s\n";
    for (const auto& [path, fetched] : paths) {
      const auto ratio = fetched.mb_per_s / stream_mb_per_s;
      std::cout << "[          ] " << profile << ": " << path << " " << fetched.mb_per_s << " MB/s, " << ratio
                << " of the stream\n";
      RecordProperty(path + "_ratio", std::to_string(ratio));
    }
  }

  /// Starts a slow chunked get and returns once the owner has sent chunks.
  Process get_in_flight(const std::string& out) {
    auto fetching = get(out, {"--pull-window", "1"});
    const auto until = steady::now() + 20s;
    while (owner_metric("corma_owner_pulls_total") < 3 && steady::now() < until) {
      if (fetching.wait_exit(1ms)) break;
    }
    EXPECT_GE(owner_metric("corma_owner_pulls_total"), 3u) << "the get never got going:\n" << fetching.captured;
    return fetching;
  }
};

/// A link profile of the issue's list, by the name the report gives it.
struct NamedProfile {
  const char* name;
  LinkProfile profile;
};

class EveryPathUnder : public FetchUnderFaults, public ::testing::WithParamInterface<NamedProfile> {};

TEST_P(EveryPathUnder, TheProfileAndArrivesByteExact) {
  link(GetParam().profile);
  make_file(16u << 20);
  auto server = serve({"--trusted-peers"});
  const auto rdma = fetch_whole("rdma.out", {"--trusted-peers"});
  const auto chunked = fetch_whole("chunked.out", {});
  const auto wide = fetch_whole("wide.out", {"--pull-window", "64"});
  report(GetParam().name, {{"rdma", rdma}, {"chunked", chunked}, {"chunked_window_64", wide}});
}

constexpr std::uint64_t gigabit = 1'000'000'000;
INSTANTIATE_TEST_SUITE_P(
    Profiles, EveryPathUnder,
    ::testing::Values(NamedProfile{"rtt_1ms", {500us, 0, 1000us, 0, gigabit}},
                      NamedProfile{"rtt_5ms", {2500us, 0, 1000us, 0, gigabit}},
                      NamedProfile{"rtt_20ms", {10000us, 0, 1000us, 0, gigabit}},
                      NamedProfile{"rtt_5ms_loss_0_1pct", {2500us, 0, 1000us, 1, gigabit}},
                      NamedProfile{"rtt_5ms_loss_1pct", {2500us, 0, 1000us, 10, gigabit}},
                      NamedProfile{"rtt_5ms_loss_5pct", {2500us, 0, 1000us, 50, gigabit}},
                      NamedProfile{"rtt_2ms_reorder_20pct", {1000us, 20, 1500us, 0, gigabit}}),
    [](const auto& named) { return std::string(named.param.name); });

/// A partition of the issue's list: which way it cuts, and the path the
/// get in flight takes (chunks, or RDMA over UCX's tcp).
struct Partition {
  const char* name;
  Cut cut;
  bool rdma;
};

class PartitionedGet : public FetchUnderFaults, public ::testing::WithParamInterface<Partition> {
 protected:
  std::optional<Process> server;

  /// A 32 MiB get over a slow link, cut once the owner is sending it.
  Process start_cut_get(std::vector<std::string> serve_flags, const std::string& out) {
    link(LinkProfile{2500us, 0, 1000us, 0, 200'000'000});
    make_file(32u << 20);
    if (GetParam().rdma) serve_flags.push_back("--trusted-peers");
    server.emplace(serve(serve_flags));
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

  void expect_owner_alive_and_bounded() {
    EXPECT_FALSE(server->wait_exit(0ms)) << "the owner died:\n" << server->captured;
    EXPECT_LT(server->resident_anonymous_bytes(), 256u << 20) << "the owner's memory grew past 256 MiB";
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

}  // namespace
}  // namespace corma::netfault
