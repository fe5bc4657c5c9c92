// The `corma` command's pieces, and `corma serve` + `corma get` as two real
// processes on loopback.
#include "address.hpp"
#include "cli/processes.hpp"
#include "file_resolver.hpp"
#include "metrics_server.hpp"
#include "sizes.hpp"
#include "transport_options.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using corma::errc;
using namespace corma::cli;
using namespace corma::cli::testing;

TEST(Sizes, ParsesUnitsAndRefusesNonsense) {
  EXPECT_EQ(parse_size("4096").value(), 4096u);
  EXPECT_EQ(parse_size("64K").value(), 64u << 10);
  EXPECT_EQ(parse_size("256M").value(), 256u << 20);
  EXPECT_EQ(parse_size("2GiB").value(), 2ull << 30);
  EXPECT_EQ(parse_size("1g").value(), 1ull << 30);
  for (auto bad : {"", "M", "12X", "5MBs", "-3", "99999999999T"}) {
    EXPECT_TRUE(parse_size(bad).error().is(errc::out_of_range)) << bad;
  }
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(3 << 20), "3.0 MiB");
}

TEST(Endpoints, ParseHostAndPort) {
  EXPECT_EQ(parse_endpoint("127.0.0.1:7300").value().port(), 7300);
  EXPECT_TRUE(parse_endpoint("[::1]:9").value().address().is_v6());
  EXPECT_EQ(parse_endpoint("localhost:0").value().address().to_string(), "127.0.0.1");
  for (auto bad : {"127.0.0.1", "host:1", "1.2.3.4:70000", "1.2.3.4:x"}) {
    EXPECT_FALSE(parse_endpoint(bad)) << bad;
  }
}

TEST_F(TempTree, ResolverServesOnlyWhatIsUnderTheRoot) {
  write_file(root / "a.txt", {'h', 'i'});
  write_file(root / "sub" / "b.bin", std::vector<char>(5000, 'b'));
  write_file(root / "empty", {});
  write_file(base / "secret", {'s'});
  fs::create_symlink(root / "a.txt", root / "inside-link");
  fs::create_symlink(base / "secret", root / "outside-link");
  fs::create_directory_symlink(base, root / "sub" / "escape");

  auto resolver = FileResolver::create(root).value();
  auto a = resolver("a.txt");
  ASSERT_TRUE(a);
  EXPECT_EQ(a.value().bytes.size(), 2u);
  EXPECT_EQ(static_cast<char>(a.value().bytes[1]), 'i');
  EXPECT_EQ(resolver("sub/b.bin").value().bytes.size(), 5000u);
  EXPECT_EQ(resolver("inside-link").value().bytes.size(), 2u);
  EXPECT_EQ(resolver("empty").value().bytes.size(), 0u);

  for (auto name : {"../secret", "sub/../../secret", "/etc/passwd", "outside-link", "sub/escape/secret"}) {
    auto refused = resolver(name);
    ASSERT_FALSE(refused) << name;
    EXPECT_TRUE(refused.error().is(errc::not_owned)) << name << ": " << refused.error().message();
  }
  EXPECT_TRUE(resolver("missing").error().is(errc::region_not_found));
  EXPECT_TRUE(resolver("sub").error().is(errc::region_not_found));
  EXPECT_TRUE(resolver("").error().is(errc::not_owned));
  EXPECT_FALSE(FileResolver::create(base / "nowhere"));
}

TEST(Metrics, RenderPathsReasonsAndRegistryFigures) {
  corma::OwnerStats owner;
  owner.decisions.rdma = 3;
  owner.decisions.chunked_by_reason["budget"] = 2;
  owner.live_leases = 1;
  corma::RegistryStats registry;
  registry.registered_bytes = 8192;
  registry.budget_bytes = 65536;
  registry.registration_latency.counts[2] = 5;
  const auto text = render_metrics(owner, &registry);
  EXPECT_NE(text.find("corma_owner_decisions_total{path=\"rdma\",reason=\"granted\"} 3"), std::string::npos);
  EXPECT_NE(text.find("corma_owner_decisions_total{path=\"chunked\",reason=\"budget\"} 2"), std::string::npos);
  EXPECT_NE(text.find("corma_owner_live_leases 1"), std::string::npos);
  EXPECT_NE(text.find("corma_registry_registered_bytes 8192"), std::string::npos);
  EXPECT_NE(text.find("corma_registry_budget_bytes 65536"), std::string::npos);
  EXPECT_NE(text.find("corma_registration_latency_us_count 5"), std::string::npos);
}

// ---- two processes ----

TEST_F(TwoProcesses, FilesArriveByteIdenticalOverEachPath) {
  std::vector<char> big(8 << 20), small(10000);
  std::mt19937 rng(42);
  for (auto& c : big) c = static_cast<char>(rng());
  for (auto& c : small) c = static_cast<char>(rng());
  write_file(root / "big.bin", big);
  write_file(root / "sub" / "small.bin", small);
  auto server = serve({"--trusted-peers"});
  const std::string owner = "127.0.0.1:" + port_after(server.captured, "listening on");

  struct Case {
    std::string path;
    std::vector<std::string> flags;
    std::string expect;
    const std::vector<char>* bytes;
  };
  const Case cases[] = {{"big.bin", {"--trusted-peers"}, "via rdma", &big},
                        {"big.bin", {}, "via chunked (no_offer)", &big},
                        {"sub/small.bin", {"--trusted-peers"}, "via chunked (below_threshold)", &small}};
  for (const auto& c : cases) {
    const auto out = base / "fetched";
    std::vector<std::string> args = {binary, "get", owner, c.path, "-o", out.string()};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    auto get = Process::start(args);
    ASSERT_EQ(get.wait_exit(std::chrono::seconds(30)), 0) << get.captured;
    EXPECT_NE(get.captured.find(c.expect), std::string::npos) << get.captured;
    EXPECT_EQ(read_file(out), *c.bytes) << c.path;
  }
  auto refused = Process::start({binary, "get", owner, "../etc/passwd", "-o", (base / "x").string()});
  EXPECT_EQ(refused.wait_exit(std::chrono::seconds(30)), 1);
  EXPECT_NE(refused.captured.find("not served"), std::string::npos) << refused.captured;
}

TEST_F(TwoProcesses, KillingTheServerMidTransferFailsTheGetQuickly) {
  write_file(root / "huge.bin", std::vector<char>(256 << 20, 'h'));
  auto server = serve();
  const std::string owner = "127.0.0.1:" + port_after(server.captured, "listening on");
  const auto metrics_port = static_cast<unsigned short>(std::stoi(port_after(server.captured, "http://127.0.0.1")));

  auto get = Process::start({binary, "get", owner, "huge.bin", "-o", (base / "huge.out").string(), "--no-rdma"});
  // Wait (on the server's own counters) until bytes are flowing.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (metric(http_get(metrics_port, "/metrics"), "corma_owner_pulled_bytes_total") == 0 &&
         std::chrono::steady_clock::now() < until) {
    ASSERT_FALSE(get.wait_exit(std::chrono::milliseconds(20)).has_value()) << get.captured;
  }
  ::kill(server.pid, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  const auto status = get.wait_exit(std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value()) << "corma get did not exit within 5 s of the server dying";
  EXPECT_NE(*status, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5));
  EXPECT_NE(get.captured.find("corma get: huge.bin:"), std::string::npos) << get.captured;
  EXPECT_NE(get.captured.find("peer"), std::string::npos) << get.captured;
}

}  // namespace

TEST(Transports, UnknownTransportIsNotConfigured) {
  auto made = corma::cli::make_backend({"carrier-pigeon", false});
  ASSERT_FALSE(made);
  EXPECT_TRUE(made.error().is(corma::errc::not_configured)) << made.error().message();
}

TEST_F(TwoProcesses, VerbsServesOnADeviceOrRefusesSayingWhy) {
  auto made = corma::cli::make_backend({"verbs", false});
  if (made) {
    EXPECT_TRUE(made.value().rma);
    EXPECT_NE(made.value().description.find("transport verbs on"), std::string::npos) << made.value().description;
    auto server = serve({"--transport", "verbs"});
    EXPECT_NE(server.captured.find("transport verbs on"), std::string::npos) << server.captured;
    return;
  }
  std::cout << "[          ] no verbs here: " << made.error().message() << '\n';
  EXPECT_TRUE(made.error().is(corma::errc::not_configured)) << made.error().message();
  auto server = Process::start({binary, "serve", "--root", root.string(), "--listen", "127.0.0.1:0", "--transport",
                                "verbs"});
  const auto status = server.wait_exit(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value()) << "serve kept running without a device";
  EXPECT_EQ(*status, 1);
  EXPECT_NE(server.captured.find(made.error().detail), std::string::npos) << server.captured;
}
