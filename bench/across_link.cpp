#include "across_link.hpp"

#include "bench_support.hpp"
#include "file_server.hpp"

#include "netfault/fault_link.hpp"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace corma::bench {

using netfault::FaultLink;
using netfault::LinkProfile;
using netfault::Side;

namespace {

using namespace std::chrono_literals;

constexpr std::size_t file_size = 256 * MiB;
constexpr std::size_t object_count = 1000;
constexpr std::size_t object_size = 64 * KiB;
const std::string round_trip = "rtt=5ms";

/// 2.5 ms each way at 1 Gbit/s, with `loss_per_mille` lost each way.
LinkProfile five_ms(unsigned loss_per_mille) {
  return LinkProfile{2500us, 0, 1000us, loss_per_mille, 1'000'000'000};
}

std::unique_ptr<FaultLink> make_link(unsigned loss_per_mille) {
  auto link = std::make_unique<FaultLink>(five_ms(loss_per_mille), CORMA_FAULT_RELAY);
  if (!link->ready()) throw std::runtime_error("the fault link: " + link->why_not());
  return link;
}

/// GB/s of a plain TCP stream of `bytes` over the link.
double tcp_stream(const FaultLink& link, std::size_t bytes) {
  const auto took = netfault::time_tcp_stream(link, bytes);
  if (!took) throw std::runtime_error("the TCP stream over the link lost bytes");
  return static_cast<double>(bytes) / std::chrono::duration<double>(*took).count() / 1e9;
}

Measurement file_fetch_across(const Options& options, unsigned loss_per_mille) {
  const std::string loss = loss_per_mille == 0 ? "" : " loss=" + std::to_string(loss_per_mille / 10) + "%";
  Measurement m{"file_fetch", "tcp", "size=" + size_name(file_size) + " chunked " + round_trip + loss, "GB/s", true,
                {}, {}, {}, true};
  m.baseline = "TCP stream over the same link";
  const auto link = make_link(loss_per_mille);
  ServedDirectory dir(file_size);
  std::optional<FileServer> server;
  {
    // The owner's listening socket and thread live in the owner's namespace.
    const auto inside = link->enter(Side::owner);
    server.emplace(dir.root, nullptr, FaultLink::address(Side::owner));
  }
  std::optional<FileGetter> getter;
  {
    const auto inside = link->enter(Side::consumer);
    getter.emplace(*server, nullptr);
  }
  (void)getter->fetch(dir, Path::chunked);  // warm: the version's snapshot stays cached
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(file_size) / getter->fetch(dir, Path::chunked) / 1e9);
    m.raw.push_back(tcp_stream(*link, file_size));
  }
  const double floor = loss_per_mille == 0 ? 0.80 : 0.70;
  m.target = "ratio >= " + std::to_string(floor).substr(0, 4);
  m.target_met = m.ratio() >= floor;
  getter.reset();
  server.reset();
  return m;
}

Measurement fetch_many_across(const Options& options, bool trusted) {
  Measurement m{"fetch_many", "tcp",
                "objects=1000 size=" + size_name(object_size) + " " + round_trip + (trusted ? " trusted" : " chunked"),
                "GB/s", true, {}, {}, {}, true};
  m.baseline = "TCP stream over the same link";
  const auto link = make_link(0);
  // Owner and consumer as processes (`ip netns exec`): UCX finds its
  // devices in /sys, which only shows a namespace's devices to a process
  // that mounted it there.
  std::vector<std::string> flags = {"--count", std::to_string(object_count), "--size", std::to_string(object_size)};
  if (trusted) flags.push_back("--trusted");
  std::vector<std::string> owner_args = {CORMA_SET_PEER, "owner", FaultLink::address(Side::owner) + ":0"};
  owner_args.insert(owner_args.end(), flags.begin(), flags.end());
  auto owner = link->launch_in(Side::owner, owner_args);
  if (!owner.wait_for("listening on ", 20s) || !owner.wait_for("\n", 1s)) {
    throw std::runtime_error("the owner across the link did not start: " + owner.said());
  }
  const auto at = owner.said().find("listening on ") + 13;
  const auto peer = owner.said().substr(at, owner.said().find('\n', at) - at);
  std::vector<std::string> consumer_args = {CORMA_SET_PEER, "consumer", peer, "many", "--rounds", "2"};
  consumer_args.insert(consumer_args.end(), flags.begin(), flags.end());
  const std::size_t total = object_count * object_size;
  for (int r = 0; r < options.rounds; ++r) {
    // Two rounds: the first warms (exports registered, keys imported), the
    // second is timed.
    const auto fetched = link->run_in(Side::consumer, consumer_args);
    const auto seconds = fetched.output.rfind("seconds ");
    if (fetched.status != 0 || seconds == std::string::npos) {
      throw std::runtime_error("the consumer across the link failed: " + fetched.output);
    }
    m.corma.push_back(static_cast<double>(total) / std::atof(fetched.output.c_str() + seconds + 8) / 1e9);
    m.raw.push_back(tcp_stream(*link, total));
  }
  m.target = "ratio >= 0.80";
  m.target_met = m.ratio() >= 0.80;
  return m;
}

}  // namespace

std::vector<Measurement> across_link(const Options& options) {
  if (auto why = FaultLink::unavailable()) {
    std::fprintf(stderr, "  rows across a 5 ms link (rtt=5ms): skipped: %s\n", why->c_str());
    return {};
  }
  std::vector<Measurement> rows;
  rows.push_back(file_fetch_across(options, 0));
  rows.push_back(file_fetch_across(options, 10));
  rows.push_back(fetch_many_across(options, false));
  rows.push_back(fetch_many_across(options, true));
  return rows;
}

}  // namespace corma::bench
