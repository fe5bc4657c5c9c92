#include "directory_resolve.hpp"

#include "bench_support.hpp"
#include "private_etcd.hpp"

#include <corma/directory.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdio>
#include <random>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t name_count = 10000;

std::string name_of(std::size_t i) { return "model/shard-" + std::to_string(i); }

/// Seconds for `count` resolutions of random names.
double resolve_random(asio::io_context& io, Directory& directory, std::size_t count, std::mt19937& random) {
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < count; ++i) {
    auto resolved = run_until_ready(io, directory.async_resolve(name_of(random() % name_count), asio::use_future));
    if (!resolved) throw std::runtime_error("resolve: " + resolved.error().message());
  }
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

}  // namespace

std::vector<Measurement> directory_resolve(const Options& options) {
  auto etcd = start_private_etcd("directory_resolve");
  if (!etcd) return {};
  asio::io_context io(1);
  DirectoryConfig config;
  config.port = etcd->client_port();
  Directory owner(io.get_executor(), config);
  Announcement announcement;
  announcement.owner = OwnerEntry{"owner-0", "127.0.0.1", 7300, "bench", "tcp", 3, 0};
  for (std::size_t i = 0; i < name_count; ++i) announcement.names.push_back(name_of(i));
  if (auto announced = run_until_ready(io, owner.async_announce(announcement, asio::use_future)); !announced) {
    throw std::runtime_error("announce: " + announced.error().message());
  }

  Measurement cached{"directory_resolve", "tcp", "names=10000 cached", "us", false, {}, {}, {}, true};
  Measurement uncached{"directory_resolve", "tcp", "names=10000 uncached", "us", false, {}, {}, {}, true};
  auto watched_config = config;
  watched_config.cache_ttl = std::chrono::hours(1);
  Directory watched(io.get_executor(), watched_config);
  auto direct_config = config;
  direct_config.watch = false;
  direct_config.cache_ttl = std::chrono::milliseconds(0);
  Directory direct(io.get_executor(), direct_config);
  std::mt19937 random(5);
  for (std::size_t i = 0; i < name_count; ++i) {  // fills the cache (the watch goes live meanwhile)
    (void)run_until_ready(io, watched.async_resolve(name_of(i), asio::use_future));
  }
  const std::size_t cached_ops = static_cast<std::size_t>(20000 * options.bytes_scale) + 1000;
  const std::size_t uncached_ops = static_cast<std::size_t>(300 * options.bytes_scale) + 50;
  for (int r = 0; r < options.rounds; ++r) {
    cached.corma.push_back(resolve_random(io, watched, cached_ops, random) * 1e6 / static_cast<double>(cached_ops));
    uncached.corma.push_back(resolve_random(io, direct, uncached_ops, random) * 1e6 /
                             static_cast<double>(uncached_ops));
  }
  cached.target = uncached.target = "reported (no target yet)";
  return {cached, uncached};
}

}  // namespace corma::bench
