#include "directory_failover.hpp"

#include "bench_support.hpp"
#include "directory/etcd_client.hpp"
#include "directory/records.hpp"
#include "private_etcd.hpp"
#include "support/run.hpp"

#include <corma/cluster_consumer.hpp>
#include <corma/directory.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_future.hpp>

#include <algorithm>
#include <cstdio>
#include <span>
#include <utility>
#include <memory>
#include <stdexcept>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t unusable_entries = 50;
constexpr std::size_t gone_owners = 50;
constexpr std::size_t object_size = 4096;

/// A port that was bound and closed again: nothing listens there.
std::uint16_t closed_port(asio::io_context& io) {
  asio::ip::tcp::acceptor probe(io, {asio::ip::make_address("127.0.0.1"), 0});
  return probe.local_endpoint().port();
}

}  // namespace

std::vector<Measurement> directory_failover(const Options& options) {
  auto etcd = start_private_etcd("directory_failover");
  if (!etcd) return {};
  asio::io_context io(1);
  DirectoryConfig config;
  config.port = etcd->client_port();
  config.machine = "bench";

  std::vector<std::byte> object(object_size, std::byte{7});
  Owner owner(io.get_executor(), nullptr, {});
  owner.publish("obj", PublishedObject{object, nullptr});
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);

  // Every one of them announced by its own Directory, as owners do: the
  // good owner loaded, the others at load 0 so that they rank first.
  std::vector<std::unique_ptr<Directory>> announcers;
  auto announce = [&](OwnerEntry entry) {
    auto& directory = announcers.emplace_back(std::make_unique<Directory>(io.get_executor(), config));
    Announcement a;
    a.owner = std::move(entry);
    a.names = {"obj"};
    if (auto announced = run_until_ready(io, directory->async_announce(a, asio::use_future)); !announced) {
      throw std::runtime_error("announce: " + announced.error().message());
    }
  };
  announce(OwnerEntry{"good", "127.0.0.1", acceptor.local_endpoint().port(), "bench", "none",
                      rendezvous_protocol_version, 10});
  for (std::size_t i = 0; i < gone_owners; ++i) {
    announce(OwnerEntry{"gone-" + std::to_string(i), "127.0.0.1", closed_port(io), "bench", "none",
                        rendezvous_protocol_version, 0});
  }
  // Entries an owner could not announce, written as a hostile writer would.
  directory::EtcdClient writer(io.get_executor(), config.host, config.port, config.request_timeout);
  for (std::size_t i = 0; i < unusable_entries; ++i) {
    const auto id = "unusable-" + std::to_string(i);
    const std::string json = i % 2 == 0 ? R"({"host": "not-an-ip", "port": 7000, "machine": "bench", "transport": "tcp", "protocol": 5, "load": 0})"
                                        : R"({"host": "127.0.0.1", "port": 7000, "machine": "bench", "transport": "tcp", "protocol": 5, "load": 1e308})";
    for (const auto& [key, value] : {std::pair{directory::owner_key(config, id), json},
                                     std::pair{directory::name_key(config, "obj", id), std::string()}}) {
      if (auto put = testing::run(io, writer.put(key, value, 0)); !put) {
        throw std::runtime_error("etcd put: " + put.error().message());
      }
    }
  }

  Measurement m{"directory_failover", "tcp", "bad_entries=100", "ms", false, {}, {}, {}, true};
  for (int r = 0; r < options.rounds * 5; ++r) {
    auto resolver = config;
    resolver.watch = false;
    ClusterConsumer cluster(io.get_executor(), std::make_shared<Directory>(io.get_executor(), resolver), nullptr);
    std::vector<std::byte> landing(object_size);
    StreamDestination destination{[&landing](std::uint64_t offset, std::span<const std::byte> chunk) {
                                    std::copy(chunk.begin(), chunk.end(), landing.begin() + static_cast<std::ptrdiff_t>(offset));
                                    return success();
                                  },
                                  {}};
    const auto start = clock_type::now();
    auto fetched = run_until_ready(io, cluster.async_fetch_to("obj", std::move(destination), asio::use_future));
    const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
    if (!fetched || fetched.value().owner != "good" || fetched.value().failed.size() != gone_owners ||
        landing != object) {
      throw std::runtime_error("directory_failover: the fetch did not end at the good owner past every gone one");
    }
    m.corma.push_back(ms);
  }
  m.target = "median <= 50 ms";
  m.target_met = m.corma_median() <= 50.0;
  m.baseline = "-";
  return {m};
}

}  // namespace corma::bench
