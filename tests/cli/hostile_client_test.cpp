// `corma serve` as a separate process against what a careless operator and a
// hostile client do: files truncated, deleted or rewritten while served,
// thousands of connections that announce huge frames and send nothing, and
// a flood of leases. The server survives each and keeps serving others.
#include "cli/flood.hpp"

#include "rendezvous/protocol/messages.hpp"


namespace {

namespace asio = boost::asio;
namespace rv = corma::rendezvous;
using namespace corma::cli::testing;
using tcp = asio::ip::tcp;

class HostileClients : public TwoProcesses {
 protected:
  asio::io_context io;

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
