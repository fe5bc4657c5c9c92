// A dead owner is reported to the consumer within 5 s on every transport:
// `corma serve` is killed with SIGKILL while `corma get` reads a large file
// from it, and `corma get` must exit non-zero, naming the unreachable peer,
// within 5 s of the kill.
#include "cli/processes.hpp"

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace corma::cli::testing;
using namespace std::chrono_literals;

/// One way `corma get` reads from `corma serve`: the flags each side takes,
/// the path the bytes then take, and what the failure must say.
struct Transport {
  std::string name;
  std::vector<std::string> serve_flags;
  std::vector<std::string> get_flags;
  std::string path;
  std::string says;
};

std::ostream& operator<<(std::ostream& out, const Transport& t) { return out << t.name; }

// Large enough that the transfer surely still runs when the kill lands, on
// any path, once `flowing` bytes are in (the get's own footprint before the
// transfer is about 10 MiB). Small enough that the RDMA get over shared
// memory is still running then, not already given up at its 5 s deadline.
constexpr std::uint64_t object_size = 512ull << 20;
constexpr std::uint64_t flowing = 64ull << 20;
constexpr auto report_bound = 5s;

class DeadOwner : public TwoProcesses, public ::testing::WithParamInterface<Transport> {
 protected:
  std::optional<Process> get;

  void TearDown() override {
    // No `corma get` may outlive its test: one still running here failed the
    // bound, and is killed (by ~Process) rather than left spinning.
    if (get && get->pid > 0) {
      EXPECT_TRUE(get->wait_exit(0ms).has_value()) << "corma get was still running after the test: killed";
    }
    get.reset();
    TwoProcesses::TearDown();
  }

  /// Waits until the server holds a lease for the get and `flowing` bytes
  /// have landed: in the output file (the chunked path writes chunks as
  /// they come) or in the get's resident anonymous memory (an RDMA get lands
  /// in memory first, whose pages become resident as the bytes land). False
  /// if the get exits first or nothing flows within the limit.
  bool wait_until_bytes_flow(unsigned short metrics_port, const std::filesystem::path& output) {
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (metric(http_get(metrics_port, "/metrics"), "corma_owner_live_leases") == 0) {
      if (get->wait_exit(10ms).has_value() || std::chrono::steady_clock::now() > until) return false;
    }
    const auto landed = [&] {
      std::error_code missing;
      const auto written = std::filesystem::file_size(output, missing);
      return std::max<std::uint64_t>(missing ? 0 : written, get->resident_anonymous_bytes());
    };
    while (landed() < flowing) {
      if (get->wait_exit(1ms).has_value() || std::chrono::steady_clock::now() > until) return false;
    }
    return true;
  }
};

TEST_P(DeadOwner, KillingTheServerMidTransferFailsTheGetWithinFiveSeconds) {
  const auto& transport = GetParam();
  // Sparse: the server still reads (and lends) every byte of it.
  std::ofstream(root / "huge.bin").close();
  std::filesystem::resize_file(root / "huge.bin", object_size);
  auto server = serve(transport.serve_flags);
  const std::string owner = "127.0.0.1:" + port_after(server.captured, "listening on");
  const auto metrics_port = static_cast<unsigned short>(std::stoi(port_after(server.captured, "http://127.0.0.1")));
  if (transport.path == "rdma") {
    ASSERT_NE(server.captured.find("RDMA on"), std::string::npos) << server.captured;
  }

  std::vector<std::string> args = {binary, "get", owner, "huge.bin", "-o", (base / "huge.out").string()};
  args.insert(args.end(), transport.get_flags.begin(), transport.get_flags.end());
  get.emplace(Process::start(args));
  ASSERT_TRUE(wait_until_bytes_flow(metrics_port, base / "huge.out"))
      << "no transfer seen; get wrote " << get->resident_anonymous_bytes() << " B:\n"
      << get->captured;

  ASSERT_EQ(::kill(server.pid, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  const auto status = get->wait_exit(report_bound);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed);
  ASSERT_TRUE(status.has_value()) << "corma get did not exit within 5 s of the server dying:\n" << get->captured;
  std::cout << "[          ] " << transport.name << ": corma get exited " << took.count() << " ms after the kill\n";
  EXPECT_NE(*status, 0) << get->captured;
  EXPECT_LT(took, report_bound);
  EXPECT_NE(get->captured.find("corma get: huge.bin: corma: peer unreachable" + transport.says), std::string::npos)
      << get->captured;
}

INSTANTIATE_TEST_SUITE_P(
    EveryTransport, DeadOwner,
    // Over shared memory only the control connection can tell (UCX there has
    // no peer error handling); over trusted tcp UCX may notice first, and the
    // fallback's first pull then meets the closed connection.
    ::testing::Values(Transport{"ucx_shm", {"--transport", "shm"}, {"--transport", "shm"}, "rdma",
                                ": lost the owner during the transfer"},
                      Transport{"ucx_tcp_untrusted", {}, {}, "chunked", ""},
                      Transport{"ucx_tcp_trusted", {"--trusted-peers"}, {"--trusted-peers"}, "rdma", ""},
                      Transport{"no_rdma", {}, {"--no-rdma"}, "chunked", ""}),
    [](const ::testing::TestParamInfo<Transport>& param) { return param.param.name; });

}  // namespace
