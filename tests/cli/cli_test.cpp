// The `corma` command's pieces, and `corma serve` + `corma get` as two real
// processes on loopback.
#include "address.hpp"
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

class TempTree : public ::testing::Test {
 protected:
  fs::path base = fs::temp_directory_path() / ("corma-cli-" + std::to_string(::getpid()) + "-" +
                                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::path root = base / "root";

  void SetUp() override {
    fs::remove_all(base);
    fs::create_directories(root / "sub");
  }
  void TearDown() override { fs::remove_all(base); }

  static void write_file(const fs::path& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::vector<char> read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
};

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

struct Process {
  pid_t pid = -1;
  int output = -1;  // stdout and stderr together
  std::string captured;

  static Process start(const std::vector<std::string>& args) {
    int pipe_fds[2];
    EXPECT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    Process p;
    EXPECT_EQ(posix_spawn(&p.pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    p.output = pipe_fds[0];
    return p;
  }

  /// Reads output until it contains `text` or the deadline passes.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (captured.find(text) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{output, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      char buffer[4096];
      const auto n = ::read(output, buffer, sizeof buffer);
      if (n <= 0) return captured.find(text) != std::string::npos;
      captured.append(buffer, static_cast<std::size_t>(n));
    }
    return true;
  }

  /// The exit status, or nullopt if it did not exit within `limit`.
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    pollfd pfd{pidfd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(limit.count()));
    ::close(pidfd);
    if (ready <= 0) return std::nullopt;
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    wait_for_output("\x01", std::chrono::milliseconds(200));  // drain what is left
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  ~Process() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (output >= 0) ::close(output);
  }
};

/// The port a "listening on 127.0.0.1:PORT" (or "http://127.0.0.1:PORT") line names.
std::string port_after(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  if (at == std::string::npos) return {};
  const auto colon = text.find(':', at + marker.size());
  const auto end = text.find_first_not_of("0123456789", colon + 1);
  return text.substr(colon + 1, end - colon - 1);
}

std::string http_get(unsigned short port, const std::string& target) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return {};
  const std::string request = "GET " + target + " HTTP/1.0\r\n\r\n";
  boost::asio::write(socket, boost::asio::buffer(request), ec);
  std::string response;
  boost::asio::read(socket, boost::asio::dynamic_buffer(response), ec);
  return response;
}

std::uint64_t metric(const std::string& page, const std::string& name) {
  const auto at = page.find("\n" + name + " ");
  return at == std::string::npos ? 0 : std::stoull(page.substr(at + name.size() + 2));
}

class TwoProcesses : public TempTree {
 protected:
  std::string binary = CORMA_BINARY;

  Process serve(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {binary, "serve", "--root", root.string(), "--listen", "127.0.0.1:0",
                                     "--metrics", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = Process::start(args);
    EXPECT_TRUE(server.wait_for_output("/metrics")) << server.captured;
    return server;
  }
};

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
