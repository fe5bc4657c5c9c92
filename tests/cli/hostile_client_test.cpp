// `corma serve` as a separate process against what a careless operator and a
// hostile client do: files truncated, deleted or rewritten while served,
// thousands of connections that announce huge frames and send nothing, and
// a flood of leases. The server survives each and keeps serving others.
#include "cli/processes.hpp"

#include "rendezvous/messages.hpp"

#include <sys/resource.h>

#include <cstring>
#include <random>

namespace {

namespace asio = boost::asio;
namespace rv = corma::rendezvous;
using namespace corma::cli::testing;
using tcp = asio::ip::tcp;

std::vector<char> random_bytes(std::size_t size, unsigned seed) {
  std::vector<char> bytes(size);
  std::mt19937_64 rng(seed);
  for (std::size_t at = 0; at < size; at += 8) {
    const auto word = rng();
    std::memcpy(bytes.data() + at, &word, std::min<std::size_t>(8, size - at));
  }
  return bytes;
}

/// The resident set of a process, in bytes (VmRSS).
std::uint64_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

/// Lets this process (and the server it starts) hold `fds` descriptors.
void allow_descriptors(rlim_t fds) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min(std::max(limit.rlim_cur, fds), limit.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

class HostileClients : public TwoProcesses {
 protected:
  asio::io_context io;

  static unsigned short port_of(const Process& server, const std::string& marker) {
    return static_cast<unsigned short>(std::stoi(port_after(server.captured, marker)));
  }

  /// Polls the server's metrics until `name` reaches `at_least`.
  static bool wait_metric(unsigned short metrics_port, const std::string& name, std::uint64_t at_least,
                          std::chrono::seconds limit = std::chrono::seconds(20)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (metric(http_get(metrics_port, "/metrics"), name) >= at_least) return true;
      ::poll(nullptr, 0, 10);
    }
    return false;
  }

  /// `corma get` of `path` into `out`; the exit status (nullopt: no exit in time).
  std::optional<int> get(const std::string& owner, const std::string& path, const fs::path& out,
                         std::vector<std::string> flags = {}, std::string* output = nullptr) {
    std::vector<std::string> args = {binary, "get", owner, path, "-o", out.string()};
    args.insert(args.end(), flags.begin(), flags.end());
    auto process = Process::start(args);
    auto status = process.wait_exit(std::chrono::seconds(30));
    if (output != nullptr) *output = process.captured;
    return status;
  }

  tcp::socket connect_raw(unsigned short port) {
    tcp::socket socket(io);
    socket.connect({asio::ip::make_address("127.0.0.1"), port});
    return socket;
  }
};

TEST_F(HostileClients, FilesChangedWhileServedNeverCrashTheServerNorMixVersions) {
  const auto original = random_bytes(32 << 20, 1);
  const auto rewritten = random_bytes(32 << 20, 2);
  write_file(root / "other.bin", random_bytes(4096, 3));
  auto server = serve({"--transport", "shm"});
  const std::string owner = "127.0.0.1:" + port_after(server.captured, "listening on");
  const auto metrics_port = port_of(server, "http://127.0.0.1");

  struct Case {
    std::string what;
    std::vector<std::string> flags;
    std::function<void(const fs::path&)> change;
  };
  const Case cases[] = {
      {"truncated during chunked pulls", {"--no-rdma"}, [](const fs::path& f) { fs::resize_file(f, 0); }},
      {"truncated during an RDMA lease", {"--transport", "shm"}, [](const fs::path& f) { fs::resize_file(f, 100); }},
      {"deleted during chunked pulls", {"--no-rdma"}, [](const fs::path& f) { fs::remove(f); }},
      {"rewritten in place, same size", {"--no-rdma"},
       [&](const fs::path& f) {
         std::fstream out(f, std::ios::in | std::ios::out | std::ios::binary);
         out.write(rewritten.data(), static_cast<std::streamsize>(rewritten.size()));
       }},
  };
  std::uint64_t pulled_before = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const auto served = root / "changing.bin";
    write_file(served, original);
    const auto out = base / "fetched";
    std::vector<std::string> args = {binary, "get", owner, "changing.bin", "-o", out.string()};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    auto fetch = Process::start(args);
    // Change the file once the server is answering this fetch (chunked: bytes
    // flow; RDMA: the lease is granted).
    if (c.flags.front() == "--no-rdma") {
      EXPECT_TRUE(wait_metric(metrics_port, "corma_owner_pulled_bytes_total", pulled_before + 1));
    } else {
      EXPECT_TRUE(wait_metric(metrics_port, "corma_owner_live_leases", 1));
    }
    c.change(served);
    ASSERT_EQ(fetch.wait_exit(std::chrono::seconds(30)), 0) << fetch.captured;
    const auto fetched = read_file(out);
    EXPECT_TRUE(fetched == original) << "a mix of versions, or a short file: " << fetched.size() << " bytes";
    pulled_before = metric(http_get(metrics_port, "/metrics"), "corma_owner_pulled_bytes_total");
    ASSERT_FALSE(server.wait_exit(std::chrono::milliseconds(0)).has_value()) << server.captured;
  }
  // The server still serves, and a new fetch sees the file as it is now.
  write_file(root / "changing.bin", rewritten);
  ASSERT_EQ(get(owner, "changing.bin", base / "now", {"--no-rdma"}), 0);
  EXPECT_TRUE(read_file(base / "now") == rewritten);
  ASSERT_EQ(get(owner, "other.bin", base / "other"), 0);
}

TEST_F(HostileClients, TwoThousandHugeFramePrefixesCostLittleMemory) {
  constexpr int greedy = 2000;
  allow_descriptors(3 * greedy + 256);
  write_file(root / "small.bin", random_bytes(10000, 4));
  auto server = serve({"--max-connections", "4096", "--max-handshakes", "4096"});
  const auto port = port_of(server, "listening on");
  const auto metrics_port = port_of(server, "http://127.0.0.1");
  const auto before = resident_bytes(server.pid);

  // Each announces the largest frame allowed and sends four bytes of it.
  std::array<std::byte, 8> prefix{};
  const std::uint32_t claim = rv::default_max_frame_body;
  for (int i = 0; i < 4; ++i) prefix[static_cast<std::size_t>(i)] = static_cast<std::byte>((claim >> (8 * i)) & 0xffU);
  std::vector<tcp::socket> sockets;
  for (int i = 0; i < greedy; ++i) {
    sockets.push_back(connect_raw(port));
    asio::write(sockets.back(), asio::buffer(prefix));
  }
  ASSERT_TRUE(wait_metric(metrics_port, "corma_owner_open_connections", greedy));
  const auto after = resident_bytes(server.pid);
  const auto grown = after > before ? after - before : 0;
  std::printf("[ figure ] %d greedy connections: server resident set %.1f -> %.1f MiB (+%.1f MiB)\n", greedy,
              static_cast<double>(before) / (1 << 20), static_cast<double>(after) / (1 << 20),
              static_cast<double>(grown) / (1 << 20));
#if defined(__SANITIZE_ADDRESS__)
  // Redzones and the quarantine of freed memory make the figure meaningless
  // under AddressSanitizer; the bound is checked by the plain build.
  std::printf("[ figure ] (AddressSanitizer build: the 64 MiB bound is not checked here)\n");
#else
  EXPECT_LT(grown, std::uint64_t{64} << 20);
#endif
  // Others are still served meanwhile.
  ASSERT_EQ(get("127.0.0.1:" + std::to_string(port), "small.bin", base / "small.out"), 0);
}

TEST_F(HostileClients, AFreshFetchIsQuickWhileAThousandConnectionsHoldSixtyFourLeasesEach) {
  constexpr int flooders = 1000;
  constexpr int leases_each = 64;
  allow_descriptors(3 * flooders + 256);
  write_file(root / "small.bin", random_bytes(10000, 5));
  write_file(root / "fresh.bin", random_bytes(20000, 6));
  // Leases that outlive the flood however slowly this machine takes it.
  auto server = serve({"--max-connections", "2048", "--max-handshakes", "2048", "--lease-timeout", "120"});
  const auto port = port_of(server, "listening on");
  const auto metrics_port = port_of(server, "http://127.0.0.1");

  // Every connection says hello and asks for 64 leases at once (pipelined).
  std::vector<std::byte> requests;
  auto append = [&](const rv::Frame& frame) {
    auto bytes = rv::encode_frame(frame);
    requests.insert(requests.end(), bytes.begin(), bytes.end());
  };
  append({1, rv::Hello{}});
  for (int i = 0; i < leases_each; ++i) append({static_cast<std::uint64_t>(2 + i), rv::Acquire{"small.bin", false}});
  std::vector<tcp::socket> sockets;
  for (int i = 0; i < flooders; ++i) {
    sockets.push_back(connect_raw(port));
    asio::write(sockets.back(), asio::buffer(requests));
  }
  ASSERT_TRUE(wait_metric(metrics_port, "corma_owner_live_leases", flooders * leases_each, std::chrono::seconds(60)))
      << metric(http_get(metrics_port, "/metrics"), "corma_owner_live_leases") << " leases";

  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(get("127.0.0.1:" + std::to_string(port), "fresh.bin", base / "fresh.out"), 0);
  const auto took = std::chrono::steady_clock::now() - start;
  std::printf("[ figure ] fresh fetch while %d leases are held: %.0f ms (process start included)\n",
              flooders * leases_each, std::chrono::duration<double, std::milli>(took).count());
  EXPECT_LT(took, std::chrono::seconds(1));
  EXPECT_TRUE(read_file(base / "fresh.out") == random_bytes(20000, 6));
}

TEST_F(HostileClients, SigtermWithFetchesInFlightExitsCleanlyWithNoRegistrationLeft) {
  write_file(root / "big.bin", random_bytes(64 << 20, 7));
  auto server = serve({"--transport", "shm"});
  const std::string owner = "127.0.0.1:" + port_after(server.captured, "listening on");
  const auto metrics_port = port_of(server, "http://127.0.0.1");
  std::vector<Process> fetches;
  for (int i = 0; i < 4; ++i) {
    const auto out = base / ("out" + std::to_string(i));
    std::vector<std::string> args = {binary, "get", owner, "big.bin", "-o", out.string(), "--transport", "shm"};
    if (i % 2 == 0) args.emplace_back("--no-rdma");
    fetches.push_back(Process::start(args));
  }
  ASSERT_TRUE(wait_metric(metrics_port, "corma_owner_live_leases", 1));
  ::kill(server.pid, SIGTERM);
  const auto status = server.wait_exit(std::chrono::seconds(20));
  ASSERT_TRUE(status.has_value()) << "serve did not stop: " << server.captured;
  EXPECT_EQ(*status, 0) << server.captured;
  EXPECT_NE(server.captured.find("stopped; 0 live registrations"), std::string::npos) << server.captured;
  // (The fetches fail or finish; whatever is left is ended with the test.)
}

}  // namespace
