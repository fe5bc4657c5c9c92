#include "renew_traffic.hpp"

#include "bench_support.hpp"
#include "support/test_backend.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include <atomic>
#include <thread>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t leases = 512;
constexpr std::size_t object_size = 64 * KiB;  // the owner's RDMA threshold: every object is lent by RDMA
constexpr std::chrono::milliseconds lease_timeout{3000};

/// Frames per second (one a second, `seconds` of them) that a consumer
/// speaking `version` sends to keep `leases` leases alive.
std::vector<double> keeping_frames(std::uint16_t version, int seconds) {
  asio::io_context io{1};
  auto work = asio::make_work_guard(io);
  auto owner_backend = testing::TestBackend::create();
  auto consumer_backend = testing::TestBackend::create();
  auto owner_registry = std::make_shared<Registry>(owner_backend, RegistryConfig{std::uint64_t{1} << 30, 0});
  auto consumer_registry = std::make_shared<Registry>(consumer_backend, RegistryConfig{std::uint64_t{1} << 30, 0});
  OwnerConfig owner_config;
  owner_config.lease_timeout = lease_timeout;
  owner_config.max_leases_per_connection = 2 * leases;
  Owner owner(io.get_executor(), owner_registry, owner_config);
  std::vector<std::byte> bytes(object_size, std::byte{3});
  for (std::size_t i = 0; i < leases; ++i) owner.publish("o" + std::to_string(i), PublishedObject{bytes, nullptr});
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  owner.serve(acceptor, asio::detached);
  std::thread thread([&] { io.run(); });

  ConsumerConfig config;
  config.max_fetches_in_flight = leases;
  config.protocol_version = version;
  auto consumer = must(Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, config,
                                         asio::use_future)
                           .get(),
                       "consumer");
  consumer_backend->hold_transfers();
  std::atomic<std::size_t> answered{0};
  asio::post(io, [&] {
    for (std::size_t i = 0; i < leases; ++i) {
      consumer->async_fetch("o" + std::to_string(i), [&](Result<Fetched>) { ++answered; });
    }
  });
  if (!consumer_backend->wait_for_transfers_in_flight(leases, std::chrono::seconds(30))) {
    throw std::runtime_error("the fetches' gets never were all in flight");
  }
  auto sent = [&] {
    return asio::post(io, asio::use_future([&] {
                        const auto stats = consumer->stats();
                        return stats.renewals + stats.heartbeats;
                      }))
        .get();
  };
  std::vector<double> per_second;
  auto before = sent();
  for (int s = 0; s < seconds; ++s) {
    std::this_thread::sleep_for(std::chrono::seconds(1));  // a measurement window, not a synchronisation
    const auto now = sent();
    per_second.push_back(static_cast<double>(now - before));
    before = now;
  }
  if (owner.stats().leases_expired != 0) throw std::runtime_error("a lease lapsed while it was kept");
  consumer_backend->release_transfers();
  while (answered.load() < leases) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  asio::post(io, [&] {
    consumer.reset();
    owner.stop();
    acceptor.close();
  });
  work.reset();
  thread.join();
  return per_second;
}

}  // namespace

Measurement renew_traffic(const Options& options) {
  Measurement m{"renew_traffic", "-", "leases=512", "frames/s", false, {}, {}, {}, true};
  m.baseline = "a version 3 consumer (a renew frame per lease)";
  const int seconds = std::max(3, options.rounds);
  m.corma = keeping_frames(4, seconds);
  m.raw = keeping_frames(3, seconds);
  m.target = "corma p50 <= 2 frames/s";
  m.target_met = m.corma_median() <= 2.0;
  return m;
}

}  // namespace corma::bench
