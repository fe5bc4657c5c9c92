// The `corma` command's pieces, and `corma serve` + `corma get` as two real
// processes on loopback.
#include "address.hpp"
#include "cli/processes.hpp"
#include "file_resolver.hpp"
#include "metrics_server.hpp"
#include "network_device.hpp"
#include "sizes.hpp"
#include "support/listening_sockets.hpp"
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
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

TEST(NetworkDevices, AnAddressNamesTheDeviceThatHoldsIt) {
  using boost::asio::ip::make_address;
  const auto loopback = device_holding(make_address("127.0.0.1"));
  ASSERT_TRUE(loopback) << loopback.error().message();
  EXPECT_EQ(device_holding(make_address("127.0.0.2")).value(), loopback.value()) << "inside the loopback network";
  for (auto wildcard : {"0.0.0.0", "::"}) {
    auto refused = device_holding(make_address(wildcard));
    ASSERT_FALSE(refused) << wildcard;
    EXPECT_TRUE(refused.error().is(errc::not_configured));
    EXPECT_NE(refused.error().detail.find("every interface"), std::string::npos) << refused.error().message();
  }
  EXPECT_TRUE(device_holding(make_address("203.0.113.7")).error().is(errc::not_configured)) << "TEST-NET-3";
  EXPECT_EQ(source_address_towards({make_address("127.0.0.1"), 7300}).value(), make_address("127.0.0.1"));
}

TEST(Transports, TrustedTcpNeedsTheAddressOfOneInterface) {
  const auto loopback = boost::asio::ip::make_address("127.0.0.1");
  auto made = make_backend({"tcp", true, loopback});
  ASSERT_TRUE(made) << made.error().message();
  const auto device = device_holding(loopback).value();
  EXPECT_NE(made.value().description.find("reaches " + device + " "), std::string::npos) << made.value().description;
  using Local = std::optional<boost::asio::ip::address>;
  for (const auto& local : {Local{}, Local{boost::asio::ip::make_address("0.0.0.0")}}) {
    auto refused = make_backend({"tcp", true, local});
    ASSERT_FALSE(refused);
    EXPECT_TRUE(refused.error().is(errc::not_configured)) << refused.error().message();
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
  EXPECT_TRUE(resolver("").error().is(errc::out_of_range));
  EXPECT_FALSE(FileResolver::create(base / "nowhere"));
}

/// The "# TYPE name kind" lines of a metrics page: name → kind.
std::map<std::string, std::string> families_of(const std::string& page) {
  std::map<std::string, std::string> families;
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    const auto space = line.find(' ', 7);
    families[line.substr(7, space - 7)] = line.substr(space + 1);
  }
  return families;
}

bool has_line(const std::string& page, const std::string& line) {
  return ("\n" + page).find("\n" + line + "\n") != std::string::npos;
}

TEST(Metrics, RenderPathsReasonsAndRegistryFigures) {
  corma::OwnerStats owner;
  owner.decisions.rdma = 3;
  owner.decisions.chunked_by_reason["budget"] = 2;
  owner.live_leases = 1;
  owner.pulled_bytes = 3 << 20;
  owner.refused_requests = 7;
  corma::RegistryStats registry;
  registry.registered_bytes = 8192;
  registry.budget_bytes = 65536;
  registry.refused_budget = 4;
  registry.registration_latency.counts[2] = 5;  // [2, 4) µs
  registry.registration_latency.sum = std::chrono::microseconds(15);
  const auto text = render_metrics(owner, &registry);
  for (const char* line : {
           R"(corma_owner_decisions_total{path="rdma",reason="granted"} 3)",
           R"(corma_owner_decisions_total{path="chunked",reason="budget"} 2)",
           "corma_owner_live_leases 1",
           "corma_owner_pulled_bytes_total 3145728",
           "corma_owner_refused_requests_total 7",
           "corma_registry_registered_bytes 8192",
           "corma_registry_budget_bytes 65536",
           R"(corma_registry_failed_registrations_total{reason="budget_exceeded"} 4)",
           // The latency in seconds: buckets up to 2^22 µs, then +Inf; _sum and _count.
           R"(corma_registration_latency_seconds_bucket{le="2e-06"} 0)",
           R"(corma_registration_latency_seconds_bucket{le="4e-06"} 5)",
           R"(corma_registration_latency_seconds_bucket{le="4.194304"} 5)",
           R"(corma_registration_latency_seconds_bucket{le="+Inf"} 5)",
           "corma_registration_latency_seconds_sum 1.5e-05",
           "corma_registration_latency_seconds_count 5",
       }) {
    EXPECT_TRUE(has_line(text, line)) << line << "\nin:\n" << text;
  }
  EXPECT_EQ(text.find("_us"), std::string::npos) << text;
}

TEST(Metrics, EveryFamilyHasHelpAndItsUnitInTheName) {
  const corma::RegistryStats registry;
  const corma::DirectoryStats directory;
  const auto text = render_metrics(corma::OwnerStats{}, &registry, &directory);
  const std::map<std::string, std::string> expected = {
      {"corma_owner_decisions_total", "counter"},
      {"corma_owner_not_found_total", "counter"},
      {"corma_owner_pulls_total", "counter"},
      {"corma_owner_pulled_bytes_total", "counter"},
      {"corma_owner_refused_requests_total", "counter"},
      {"corma_owner_leases_expired_total", "counter"},
      {"corma_owner_leases_released_total", "counter"},
      {"corma_owner_connections_total", "counter"},
      {"corma_owner_refused_connections_total", "counter"},
      {"corma_owner_exports_registered_total", "counter"},
      {"corma_owner_exports_evicted_total", "counter"},
      {"corma_owner_windows_total", "counter"},
      {"corma_owner_batch_requests_total", "counter"},
      {"corma_owner_open_connections", "gauge"},
      {"corma_owner_live_leases", "gauge"},
      {"corma_registry_budget_bytes", "gauge"},
      {"corma_registry_registered_bytes", "gauge"},
      {"corma_registry_reserved_bytes", "gauge"},
      {"corma_registry_regions", "gauge"},
      {"corma_registry_registrations_total", "counter"},
      {"corma_registry_deregistrations_total", "counter"},
      {"corma_registry_failed_registrations_total", "counter"},
      {"corma_registry_unconfirmed_unmaps_total", "counter"},
      {"corma_registry_leaked_owned_buffers_total", "counter"},
      {"corma_registry_cache_hits_total", "counter"},
      {"corma_registry_cache_misses_total", "counter"},
      {"corma_registry_cache_evictions_total", "counter"},
      {"corma_registry_cache_idle_bytes", "gauge"},
      {"corma_registry_arenas", "gauge"},
      {"corma_registry_arena_capacity_bytes", "gauge"},
      {"corma_registry_arena_allocated_bytes", "gauge"},
      {"corma_registry_arena_slices", "gauge"},
      {"corma_registration_latency_seconds", "histogram"},
      {"corma_directory_etcd_requests_total", "counter"},
      {"corma_directory_etcd_failures_total", "counter"},
      {"corma_directory_leases_granted_total", "counter"},
      {"corma_directory_resolutions_total", "counter"},
      {"corma_directory_cache_hits_total", "counter"},
      {"corma_directory_stale_resolutions_total", "counter"},
      {"corma_directory_rejected_entries_total", "counter"},
      {"corma_directory_announced", "gauge"},
      {"corma_directory_watching", "gauge"},
  };
  const auto families = families_of(text);
  EXPECT_EQ(families, expected) << text;
  for (const auto& [name, kind] : families) {
    const auto help = text.find("# HELP " + name + " ");
    EXPECT_NE(help, std::string::npos) << name << " has no HELP";
    EXPECT_GT(text.find('\n', help), help + name.size() + 8) << name << "'s HELP is empty";
    EXPECT_EQ(kind == "counter", name.ends_with("_total")) << name;
    if (name.find("bytes") != std::string::npos) {
      EXPECT_TRUE(name.ends_with(kind == "counter" ? "_bytes_total" : "_bytes")) << name;
    }
    if (kind == "histogram") {
      EXPECT_TRUE(name.ends_with("_seconds")) << name;
    }
  }
  // Without a registry, only the owner's families.
  for (const auto& [name, kind] : families_of(render_metrics(corma::OwnerStats{}, nullptr))) {
    EXPECT_EQ(name.rfind("corma_owner_", 0), 0u) << name;
  }
}

TEST(Metrics, TheDirectorysFiguresSayWhenEtcdIsAwayAndAnswersComeFromTheCache) {
  corma::DirectoryStats directory;
  directory.announced = true;
  directory.watching = false;
  directory.resolutions = 9;
  directory.stale_resolutions = 4;
  directory.etcd_failures = 2;
  directory.leases_granted = 2;
  directory.rejected_entries = 3;
  const auto text = render_metrics(corma::OwnerStats{}, nullptr, &directory);
  for (const char* line : {"corma_directory_announced 1", "corma_directory_watching 0",
                           "corma_directory_resolutions_total 9", "corma_directory_stale_resolutions_total 4",
                           "corma_directory_etcd_failures_total 2", "corma_directory_leases_granted_total 2",
                           "corma_directory_rejected_entries_total 3"}) {
    EXPECT_TRUE(has_line(text, line)) << line << "\nin:\n" << text;
  }
  EXPECT_EQ(render_metrics(corma::OwnerStats{}, nullptr).find("corma_directory_"), std::string::npos)
      << "no directory, no directory families";
}

TEST(Metrics, ScrapesFollowTheSnapshotsAndCountersNeverGoBack) {
  OwnerMetrics metrics(true);
  corma::OwnerStats owner;
  corma::RegistryStats registry;
  owner.pulled_bytes = 100;
  owner.live_leases = 4;
  registry.registration_latency.counts[0] = 2;
  registry.registration_latency.sum = std::chrono::nanoseconds(1500);
  metrics.update(owner, &registry);
  metrics.update(owner, &registry);  // the same snapshot again adds nothing
  auto text = metrics.render();
  EXPECT_TRUE(has_line(text, "corma_owner_pulled_bytes_total 100")) << text;
  EXPECT_TRUE(has_line(text, "corma_owner_live_leases 4")) << text;
  EXPECT_TRUE(has_line(text, "corma_registration_latency_seconds_count 2")) << text;
  EXPECT_TRUE(has_line(text, "corma_registration_latency_seconds_sum 1.5e-06")) << text;

  // A smaller snapshot: the gauge follows it, the counter holds.
  owner.pulled_bytes = 50;
  owner.live_leases = 1;
  metrics.update(owner, &registry);
  text = metrics.render();
  EXPECT_TRUE(has_line(text, "corma_owner_pulled_bytes_total 100")) << text;
  EXPECT_TRUE(has_line(text, "corma_owner_live_leases 1")) << text;

  owner.pulled_bytes = 250;
  owner.decisions.chunked_by_reason["no_offer"] = 1;
  registry.registration_latency.counts[3] = 1;
  registry.registration_latency.sum = std::chrono::nanoseconds(6500);
  metrics.update(owner, &registry);
  text = metrics.render();
  EXPECT_TRUE(has_line(text, "corma_owner_pulled_bytes_total 250")) << text;
  EXPECT_TRUE(has_line(text, R"(corma_owner_decisions_total{path="chunked",reason="no_offer"} 1)")) << text;
  EXPECT_TRUE(has_line(text, "corma_registration_latency_seconds_count 3")) << text;
  EXPECT_TRUE(has_line(text, "corma_registration_latency_seconds_sum 6.5e-06")) << text;
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
  // A server whose budget cannot hold big.bin: it lends it in windows.
  auto small_budget = serve({"--trusted-peers", "--budget", "3M"});
  const std::string windowed = "127.0.0.1:" + port_after(small_budget.captured, "listening on");

  struct Case {
    const std::string& owner;
    std::string path;
    std::vector<std::string> flags;
    std::string expect;
    const std::vector<char>* bytes;
  };
  const Case cases[] = {{owner, "big.bin", {"--trusted-peers"}, "via rdma,", &big},
                        {windowed, "big.bin", {"--trusted-peers"}, "via rdma in ", &big},
                        {owner, "big.bin", {}, "via chunked (no_offer)", &big},
                        {owner, "sub/small.bin", {"--trusted-peers"}, "via chunked (below_threshold)", &small}};
  for (const auto& c : cases) {
    const auto out = base / "fetched";
    std::vector<std::string> args = {binary, "get", c.owner, c.path, "-o", out.string()};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    auto get = Process::start(args);
    ASSERT_EQ(get.wait_exit(std::chrono::seconds(30)), 0) << get.captured;
    EXPECT_NE(get.captured.find(c.expect), std::string::npos) << get.captured;
    EXPECT_EQ(read_file(out), *c.bytes) << c.path;
  }
  auto refused = Process::start({binary, "get", owner, "../etc/passwd", "-o", (base / "x").string()});
  EXPECT_EQ(refused.wait_exit(std::chrono::seconds(30)), 1);
  EXPECT_NE(refused.captured.find("not served"), std::string::npos) << refused.captured;

  // An output that is not a regular file is written, not mapped, over
  // RDMA too, and never removed when the fetch fails.
  auto discarded = Process::start({binary, "get", owner, "big.bin", "-o", "/dev/null", "--trusted-peers"});
  ASSERT_EQ(discarded.wait_exit(std::chrono::seconds(30)), 0) << discarded.captured;
  EXPECT_NE(discarded.captured.find("via rdma,"), std::string::npos) << discarded.captured;
  const auto fifo = base / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto missing = Process::start({binary, "get", owner, "missing.bin", "-o", fifo.string(), "--trusted-peers"});
  EXPECT_EQ(missing.wait_exit(std::chrono::seconds(30)), 1) << missing.captured;
  EXPECT_TRUE(std::filesystem::is_fifo(fifo)) << "a failed fetch removed an output that is not a regular file";
}

TEST_F(TwoProcesses, GetPushHasTheServerWriteTheFileOrReadsItSayingWhy) {
  std::vector<char> big(6 << 20);
  std::mt19937 rng(7);
  for (auto& c : big) c = static_cast<char>(rng());
  write_file(root / "big.bin", big);
  auto pushing = serve({"--transport", "shm", "--accept-push"});
  EXPECT_NE(pushing.captured.find("pushes accepted"), std::string::npos) << pushing.captured;
  auto reading = serve({"--transport", "shm"});
  EXPECT_NE(reading.captured.find("pushes refused (--accept-push takes them)"), std::string::npos)
      << reading.captured;
  struct Case {
    std::string owner;
    std::string expect;
  };
  const Case cases[] = {
      {"127.0.0.1:" + port_after(pushing.captured, "listening on"), "via rdma, pushed by the server, generation "},
      {"127.0.0.1:" + port_after(reading.captured, "listening on"),
       "via rdma, read: the push was refused (corma: not configured: owner: this owner takes no pushes)"}};
  for (const auto& c : cases) {
    const auto out = base / "pushed";
    auto get = Process::start({binary, "get", c.owner, "big.bin", "-o", out.string(), "--transport", "shm", "--push"});
    ASSERT_EQ(get.wait_exit(std::chrono::seconds(30)), 0) << get.captured;
    EXPECT_NE(get.captured.find(c.expect), std::string::npos) << get.captured;
    EXPECT_EQ(read_file(out), big);
  }
  // What cannot push is refused before anything is fetched.
  const auto owner = cases[0].owner;
  auto chunks_only = Process::start({binary, "get", owner, "big.bin", "-o", (base / "x").string(), "--push"});
  EXPECT_EQ(chunks_only.wait_exit(std::chrono::seconds(30)), 2) << chunks_only.captured;
  EXPECT_NE(chunks_only.captured.find("--push needs a transport that exposes this side's memory"), std::string::npos)
      << chunks_only.captured;
  EXPECT_FALSE(std::filesystem::exists(base / "x"));
}

TEST_F(TwoProcesses, ServeListensOnlyWhereItIsTold) {
  using boost::asio::ip::tcp;
  const auto loopback = boost::asio::ip::make_address("127.0.0.1");
  struct Case {
    std::vector<std::string> flags;
    bool ucx_listens;
  };
  const Case cases[] = {{{}, false}, {{"--transport", "shm"}, false}, {{"--trusted-peers"}, true}};
  for (const auto& c : cases) {
    std::vector<std::string> args = {binary, "serve", "--root", root.string(), "--listen", "127.0.0.1:0"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    auto server = Process::start(args);
    ASSERT_TRUE(server.wait_for_output("listening on")) << server.captured;
    const auto port = static_cast<unsigned short>(std::stoi(port_after(server.captured, "listening on")));
    const tcp::endpoint listen{loopback, port};
    const auto sockets = corma::testing::listening_sockets(server.pid);
    if (!c.ucx_listens) {
      EXPECT_EQ(sockets, std::vector<tcp::endpoint>{listen}) << server.captured;
      continue;
    }
    // Trusted tcp: UCX listens too, but only on the interface of --listen.
    EXPECT_EQ(std::count(sockets.begin(), sockets.end(), listen), 1) << server.captured;
    EXPECT_GE(sockets.size(), 2u);
    for (const auto& socket : sockets) EXPECT_EQ(socket.address(), loopback) << socket;
  }
  auto everywhere = Process::start(
      {binary, "serve", "--root", root.string(), "--listen", "0.0.0.0:0", "--trusted-peers"});
  EXPECT_EQ(everywhere.wait_exit(std::chrono::seconds(10)), 1);
  EXPECT_NE(everywhere.captured.find("every interface"), std::string::npos) << everywhere.captured;
}

/// Where `name` is found on PATH, or empty.
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "";
  while (!dirs.empty()) {
    const auto colon = dirs.find(':');
    const auto candidate = fs::path(std::string(dirs.substr(0, colon))) / name;
    if (!candidate.parent_path().empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return {};
}

TEST_F(TwoProcesses, PromtoolAcceptsTheServedMetrics) {
  const auto promtool = find_on_path("promtool");
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool is not on PATH (it comes with Debian's prometheus package, which scripts/setup "
                    "leaves out: it installs and starts a Prometheus server); the page was not checked by promtool";
  }
  write_file(root / "big.bin", std::vector<char>(1 << 20, 'b'));
  write_file(root / "small.bin", std::vector<char>(100, 's'));
  auto server = serve({"--trusted-peers"});
  const std::string owner = "127.0.0.1:" + port_after(server.captured, "listening on");
  const auto metrics_port = static_cast<unsigned short>(std::stoi(port_after(server.captured, "http://127.0.0.1")));
  // Something in every kind of family: an RDMA grant (a registration), a
  // chunked answer, a name not served.
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"big.bin", {"--trusted-peers"}}, {"small.bin", {}}, {"missing", {}}}) {
    std::vector<std::string> args = {binary, "get", owner, name, "-o", (base / "fetched").string()};
    args.insert(args.end(), flags.begin(), flags.end());
    auto get = Process::start(args);
    ASSERT_TRUE(get.wait_exit(std::chrono::seconds(30)).has_value()) << get.captured;
  }
  const auto response = http_get(metrics_port, "/metrics");
  const auto body_at = response.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos) << response;
  EXPECT_NE(response.find("text/plain; version=0.0.4"), std::string::npos) << response;
  const auto page = response.substr(body_at + 4);
  EXPECT_GT(metric(page, "corma_registration_latency_seconds_count"), 0u) << page;
  const auto file = base / "metrics.txt";
  write_file(file, std::vector<char>(page.begin(), page.end()));

  auto check = Process::start({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", promtool, file.string()});
  const auto status = check.wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "promtool did not finish";
  EXPECT_EQ(*status, 0) << check.captured;
  EXPECT_EQ(check.captured, "") << "promtool check metrics found problems:\n" << check.captured << "\nin:\n" << page;
  std::cout << "[          ] " << promtool << " check metrics: exit " << *status << ", "
            << (check.captured.empty() ? "no warning, no error" : check.captured) << '\n';
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

namespace {

/// The long options (`--name`) a `corma SUBCOMMAND --help` lists.
std::set<std::string> options_in_help(const std::string& help) {
  std::set<std::string> options;
  const std::regex option("(^|[ ,])(--[a-z][a-z-]+)");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), option); it != std::sregex_iterator(); ++it) {
    options.insert((*it)[2].str());
  }
  options.erase("--help");
  return options;
}

}  // namespace

TEST_F(TwoProcesses, TheUsageDocumentDescribesEveryFlagOfEveryCommand) {
  std::ifstream file(CORMA_USAGE_DOC);
  const std::string usage((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(usage.empty()) << "cannot read " << CORMA_USAGE_DOC;
  for (const char* command : {"serve", "get", "ls"}) {
    auto help = Process::start({binary, command, "--help"});
    ASSERT_EQ(help.wait_exit(std::chrono::seconds(10)), 0) << help.captured;
    const auto options = options_in_help(help.captured);
    EXPECT_GE(options.size(), 2u) << help.captured;
    for (const auto& option : options) {
      EXPECT_NE(usage.find("`" + option), std::string::npos)
          << "docs/usage.md does not describe corma " << command << " " << option;
    }
  }
}
