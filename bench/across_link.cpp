#include "across_link.hpp"

#include "bench_support.hpp"
#include "file_server.hpp"
#include "object_service.hpp"

#include "netfault/fault_link.hpp"

#include <corma/ucx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

namespace corma::bench {

namespace asio = boost::asio;
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

/// The link's device (as `ip netns exec` shows it in /sys: UCX finds its
/// devices there, which is why the fetch_many rows run as processes).
constexpr const char* link_device = "fault0";

/// A registry over UCX: trusted tcp on the link's device, or (chunked) a
/// shared-memory backend for local registrations only.
std::shared_ptr<Registry> role_registry(bool trusted) {
  auto config = corma_config(trusted ? "tcp" : "shm");
  if (trusted) config.tcp_interface = link_device;
  return std::make_shared<Registry>(must(ucx::Backend::create(config), "backend"), RegistryConfig{1ULL << 32, 0});
}

std::string object_name(std::size_t i) { return "kv/block-" + std::to_string(i); }

Measurement fetch_many_across(const Options& options, const std::string& self, bool trusted) {
  Measurement m{"fetch_many", "tcp",
                "objects=1000 size=" + size_name(object_size) + " " + round_trip + (trusted ? " trusted" : " chunked"),
                "GB/s", true, {}, {}, {}, true};
  m.baseline = "TCP stream over the same link";
  const auto link = make_link(0);
  const std::string mode = trusted ? "trusted" : "chunked";
  auto owner = link->launch_in(Side::owner, {self, "--link-role", "owner", "--link-mode", mode, "--link-address",
                                             FaultLink::address(Side::owner) + ":0"});
  if (!owner.wait_for("listening on ", 20s) || !owner.wait_for("\n", 1s)) {
    throw std::runtime_error("the owner across the link did not start: " + owner.said());
  }
  const auto at = owner.said().find("listening on ") + 13;
  const auto peer = owner.said().substr(at, owner.said().find('\n', at) - at);
  const std::size_t total = object_count * object_size;
  for (int r = 0; r < options.rounds; ++r) {
    const auto fetched = link->run_in(Side::consumer, {self, "--link-role", "consumer", "--link-mode", mode,
                                                       "--link-address", peer});
    const auto seconds = fetched.output.find("seconds ");
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

asio::ip::tcp::endpoint parse_endpoint(const std::string& text) {
  const auto colon = text.rfind(':');
  return {asio::ip::make_address(text.substr(0, colon)),
          static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1)))};
}

/// The owner's side of a fetch_many row: the objects, served until killed.
int serve_objects(bool trusted, const std::string& address) {
  asio::io_context io{1};
  auto objects = OwnedBuffer::allocate(object_count * object_size);
  std::memset(objects.data(), 7, objects.size());
  OwnerConfig config;
  config.rdma_threshold = object_size;
  Owner owner(io.get_executor(), trusted ? role_registry(true) : nullptr, config);
  for (std::size_t i = 0; i < object_count; ++i) {
    owner.publish(object_name(i), PublishedObject{{objects.data() + i * object_size, object_size}, nullptr});
  }
  asio::ip::tcp::acceptor acceptor(io, parse_endpoint(address));
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);
  std::printf("listening on %s:%u\n", acceptor.local_endpoint().address().to_string().c_str(),
              acceptor.local_endpoint().port());
  std::fflush(stdout);
  io.run();
  return 0;
}

/// The consumer's side: one warm fetch of the set, then one timed.
int fetch_objects(bool trusted, const std::string& peer) {
  asio::io_context io{1};
  auto work = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  const auto registry = role_registry(trusted);
  auto consumer = must(Consumer::connect(io.get_executor(), parse_endpoint(peer), registry, {}, asio::use_future).get(),
                       "consumer");
  auto landing = OwnedBuffer::allocate(object_count * object_size);
  auto region = must(registry->async_register(landing.bytes(), Access::local, asio::use_future).get(), "landing");
  std::vector<std::string> names;
  std::vector<FetchSlot> slots;
  for (std::size_t i = 0; i < object_count; ++i) {
    names.push_back(object_name(i));
    slots.push_back(FetchSlot{&region, i * object_size, object_size});
  }
  const Path expected = trusted ? Path::rdma : Path::chunked;
  const auto fetch_set = [&] {
    return time_awaits(io, 1, [&]() -> asio::awaitable<void> {
      auto fetched = co_await consumer->async_fetch_many(names, slots);
      for (const auto& outcome : must(std::move(fetched), "fetch_many")) {
        if (!outcome || outcome.value().path != expected) throw std::runtime_error("an object took the wrong path");
      }
    });
  };
  (void)fetch_set();  // warm: exports registered, keys imported
  std::printf("seconds %.9f\n", fetch_set());
  asio::post(io, [&] { consumer.reset(); });
  work.reset();
  runner.join();
  return 0;
}

}  // namespace

std::vector<Measurement> across_link(const Options& options, const std::string& self) {
  if (auto why = FaultLink::unavailable()) {
    std::fprintf(stderr, "  rows across a 5 ms link (rtt=5ms): skipped: %s\n", why->c_str());
    return {};
  }
  std::vector<Measurement> rows;
  rows.push_back(file_fetch_across(options, 0));
  rows.push_back(file_fetch_across(options, 10));
  rows.push_back(fetch_many_across(options, self, false));
  rows.push_back(fetch_many_across(options, self, true));
  return rows;
}

int across_link_role(const std::string& role, const std::string& mode, const std::string& address) {
  const bool trusted = mode == "trusted";
  try {
    if (role == "owner") return serve_objects(trusted, address);
    if (role == "consumer") return fetch_objects(trusted, address);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "corma-bench %s: %s\n", role.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "corma-bench: --link-role is owner or consumer\n");
  return 2;
}

}  // namespace corma::bench
