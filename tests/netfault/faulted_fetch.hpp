// The fixture of the network fault tests that run the `corma` command: a
// link between two namespaces (NetworkPair), a served tree holding one
// file, `corma serve` in the owner's namespace and `corma get` in the
// consumer's, as processes, with the owners' metrics read from inside their
// namespace.
#pragma once

#include "netfault/network_pair.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <random>

namespace corma::netfault {

using namespace std::chrono_literals;
using cli::testing::metric;
using cli::testing::port_after;
using steady = std::chrono::steady_clock;

/// A `corma serve` process and where it listens.
struct ServingOwner {
  Process process;
  std::uint16_t port = 0;     ///< rendezvous, on the owner's address
  std::uint16_t metrics = 0;  ///< on the owner namespace's loopback
};

class FetchUnderFaults : public cli::testing::TempTree {
 protected:
  std::unique_ptr<NetworkPair> pair;
  std::vector<char> content;
  /// The first owner started (serve()); tests with more keep their own.
  std::optional<ServingOwner> owner;

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

  /// `corma serve` of the tree in the owner's namespace, on a port of its own.
  ServingOwner start_owner(std::vector<std::string> extra) {
    std::vector<std::string> args = {CORMA_BINARY, "serve", "--root", root.string(), "--listen",
                                     NetworkPair::address(Side::owner) + ":0", "--metrics", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    ServingOwner started{pair->start_in(Side::owner, args)};
    EXPECT_TRUE(started.process.wait_for_output("/metrics")) << started.process.captured;
    started.port = static_cast<std::uint16_t>(std::stoi(port_after(started.process.captured, "listening on")));
    started.metrics = static_cast<std::uint16_t>(std::stoi(port_after(started.process.captured, "metrics on http://")));
    return started;
  }

  void serve(std::vector<std::string> extra) { owner.emplace(start_owner(std::move(extra))); }

  [[nodiscard]] std::uint64_t metric_of(const ServingOwner& of, const std::string& name) const {
    return metric(http_get_in(*pair, Side::owner, of.metrics, "/metrics"), name);
  }
  [[nodiscard]] std::uint64_t owner_metric(const std::string& name) const { return metric_of(*owner, name); }

  void expect_owner_alive_and_bounded() {
    EXPECT_FALSE(owner->process.wait_exit(std::chrono::milliseconds(0))) << "the owner died:\n"
                                                                          << owner->process.captured;
    EXPECT_LT(owner->process.resident_anonymous_bytes(), 256u << 20) << "the owner's memory grew past 256 MiB";
  }

  /// `corma get` of the file from `from` (the first owner by default).
  Process get(const std::string& out, std::vector<std::string> extra, const ServingOwner* from = nullptr) {
    const auto port = (from != nullptr ? from : &*owner)->port;
    std::vector<std::string> args = {CORMA_BINARY, "get", NetworkPair::address(Side::owner) + ":" +
                                     std::to_string(port), "f.bin", "-o", (base / out).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return pair->start_in(Side::consumer, args);
  }

  struct Fetched {
    steady::duration took{};  ///< the whole command, start to exit
    double mb_per_s = 0;      ///< the speed corma get reports (connection and fetch)
  };

  /// A get run to its end, after checking every byte.
  Fetched fetch_whole(const std::string& out, std::vector<std::string> extra, const ServingOwner* from = nullptr,
                      const std::string& path_said = "") {
    const auto start = steady::now();
    auto fetching = get(out, std::move(extra), from);
    const auto status = fetching.wait_exit(60s);
    Fetched fetched{steady::now() - start};
    EXPECT_EQ(status.value_or(-1), 0) << fetching.captured;
    EXPECT_TRUE(read_file(base / out) == content) << out << " differs from the served file";
    EXPECT_NE(fetching.captured.find(path_said), std::string::npos) << "not " << path_said << ": " << fetching.captured;
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

}  // namespace corma::netfault
