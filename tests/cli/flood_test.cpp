// `corma serve` as a separate process under floods of acquires: a newcomer's
// `corma get` is timed, process start included, again and again while the
// flood ramps up and while the server works it off, and the server's memory
// stays bounded.
#include "cli/flood.hpp"

#include "rendezvous/protocol/messages.hpp"

namespace {

namespace rv = corma::rendezvous;
using namespace corma::cli::testing;

class Flood : public TwoProcesses {
 protected:
  /// Frames one after the other, as one write.
  static std::vector<std::byte> frames(const std::vector<rv::Frame>& list) {
    std::vector<std::byte> bytes;
    for (const auto& frame : list) {
      auto encoded = rv::encode_frame(frame);
      bytes.insert(bytes.end(), encoded.begin(), encoded.end());
    }
    return bytes;
  }

  /// How long a fresh fetch may take: a second, as promised; under a
  /// sanitizer, which slows every process several times over, the test
  /// checks that nobody is starved rather than the figure.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  static constexpr double quick_ms = 5000;
#else
  static constexpr double quick_ms = 1000;
#endif

  /// Every fetch succeeded within quick_ms; prints the figures.
  static void expect_quick(const std::vector<double>& took, const std::string& failures, const char* during) {
    double slowest = 0;
    for (double ms : took) slowest = std::max(slowest, ms);
    std::string list;
    for (double ms : took) list += " " + std::to_string(static_cast<int>(ms));
    std::printf("[ figure ] fresh corma get (ms, process start included) %s:%s\n", during, list.c_str());
    if (!failures.empty()) std::printf("%s\n", failures.c_str());
    for (double ms : took) {
      EXPECT_GE(ms, 0) << "a fresh fetch failed";
      EXPECT_LT(ms, quick_ms) << "a fresh fetch took " << ms << " ms";
    }
  }
};

TEST_F(Flood, AFreshFetchIsQuickThroughoutTwoHundredConnectionsPipeliningBatches) {
  constexpr int flooders = 200;
  constexpr int batches = 36;
  allow_descriptors(3 * flooders + 256);
  std::vector<std::string> names;
  for (int i = 0; i < 251; ++i) {
    names.push_back("f_" + std::to_string(i));
    write_file(root / names.back(), random_bytes(4096, static_cast<unsigned>(i)));
  }
  write_file(root / "fresh.bin", random_bytes(4096, 1000));
  auto server = serve();
  const auto port = port_of(server, "listening on");
  const auto before = resident_bytes(server.pid);
  const double cpu_before = cpu_seconds(server.pid);

  // Each connection pipelines 36 batches of 251 names, and then 36 more
  // each time those are written, reading its answers only to throw them
  // away: the server is never out of their work.
  std::vector<rv::Frame> opening{{1, rv::Hello{}}};
  std::vector<rv::Frame> more;
  for (std::uint64_t i = 0; i < batches; ++i) {
    opening.push_back({2 + i, rv::AcquireMany{names, false}});
    more.push_back({2 + i, rv::AcquireMany{names, false}});
  }
  FreshFetches fresh({binary, "get", "127.0.0.1:" + std::to_string(port), "fresh.bin", "-o",
                      (base / "fresh.out").string()});
  const auto start = std::chrono::steady_clock::now();
  {
    Flooders flood(port, flooders, frames(opening), frames(more), true);
    // Ten fetches at least, over two seconds of flood at least.
    const auto fetched_before = fresh.done();
    while (fresh.done() < fetched_before + 10 || std::chrono::steady_clock::now() - start < std::chrono::seconds(2)) {
      ::poll(nullptr, 0, 10);
    }
    const auto grown = resident_bytes(server.pid);
    std::printf("[ figure ] server resident set %.1f -> %.1f MiB while flooded\n",
                static_cast<double>(before) / (1 << 20), static_cast<double>(grown) / (1 << 20));
#if !defined(__SANITIZE_ADDRESS__)
    EXPECT_LT(grown, before + (std::uint64_t{256} << 20)) << "the server's memory grew with the flood";
#endif
  }
  fresh.stop();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double busy = cpu_seconds(server.pid) - cpu_before;
  std::printf("[ figure ] the server used %.1f s of CPU in %.1f s\n", busy, wall);
  EXPECT_GT(busy, 0.5 * wall) << "the flood did not load the server: the figures prove nothing";
  expect_quick(fresh.took(), fresh.failures(), "during the flood");
  EXPECT_TRUE(read_file(base / "fresh.out") == random_bytes(4096, 1000));
}

TEST_F(Flood, AFreshFetchIsQuickWhileAThousandConnectionsAskSixtyFourLeasesEach) {
  constexpr int flooders = 1000;
  constexpr int leases_each = 64;
  allow_descriptors(3 * flooders + 256);
  write_file(root / "small.bin", random_bytes(10000, 5));
  write_file(root / "fresh.bin", random_bytes(4096, 6));
  // Leases that outlive the flood however slowly this machine takes it.
  auto server = serve({"--max-connections", "2048", "--max-handshakes", "2048", "--lease-timeout", "120"});
  const auto port = port_of(server, "listening on");
  const auto metrics_port = port_of(server, "http://127.0.0.1");

  // Version 1: each connection says hello and asks for 64 leases at once.
  std::vector<rv::Frame> requests{{1, rv::Hello{1, corma::BackendId::none, {}}}};
  for (int i = 0; i < leases_each; ++i) {
    requests.push_back({static_cast<std::uint64_t>(2 + i), rv::Acquire{"small.bin", false}});
  }
  FreshFetches fresh({binary, "get", "127.0.0.1:" + std::to_string(port), "fresh.bin", "-o",
                      (base / "fresh.out").string()});
  {
    Flooders flood(port, flooders, frames(requests), {}, false);
    // Every acquire answered: a lease, or (once the owner holds half its
    // leases) a refusal for a connection that holds its share.
    auto answered = [&] {
      const auto page = http_get(metrics_port, "/metrics");
      return metric(page, "corma_owner_live_leases") + metric(page, "corma_owner_refused_requests_total");
    };
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (answered() < flooders * leases_each && std::chrono::steady_clock::now() < until) ::poll(nullptr, 0, 10);
    ASSERT_GE(answered(), flooders * leases_each);
    const auto ramped = fresh.done();
    expect_quick(fresh.took(), fresh.failures(), "while the leases were acquired");
    while (fresh.done() < ramped + 3) ::poll(nullptr, 0, 10);
  }
  fresh.stop();
  expect_quick(fresh.took(), fresh.failures(), "with the leases held");
  EXPECT_TRUE(read_file(base / "fresh.out") == random_bytes(4096, 6));
}

}  // namespace
