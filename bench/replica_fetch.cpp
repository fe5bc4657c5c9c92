#include "replica_fetch.hpp"

#include "object_service.hpp"
#include "support/etcd_process.hpp"

#include <corma/cluster_consumer.hpp>
#include <corma/directory.hpp>

#include <cstdio>
#include <functional>
#include <future>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t object_count = 1000;
constexpr std::size_t object_size = 64 * KiB;
constexpr std::size_t replicas = 3;

std::string object_name(std::size_t i) { return "kv/block-" + std::to_string(i); }

void check(const ManyFetched& outcomes) {
  for (const auto& outcome : outcomes) {
    if (!outcome || outcome.value().path != Path::rdma) throw std::runtime_error("an object missed RDMA");
  }
}

}  // namespace

std::optional<Measurement> fetch_many_replicas(const Options& options) {
  if (auto missing = testing::EtcdProcess::missing()) {
    std::fprintf(stderr, "  fetch_many replicas=3: skipped: %s\n", missing->c_str());
    return std::nullopt;
  }
  testing::EtcdProcess etcd;
  if (!etcd.start()) throw std::runtime_error("etcd did not start: " + etcd.output());
  DirectoryConfig directory_config;
  directory_config.port = etcd.client_port();

  Measurement m{"fetch_many", "tcp", "objects=1000 size=64KiB warm replicas=3", "GB/s", true, {}, {}, {}, true};
  m.baseline = "one owner";
  OwnerConfig config;
  config.rdma_threshold = object_size;  // every object by RDMA
  std::vector<std::unique_ptr<ObjectService>> owners;
  std::vector<std::unique_ptr<Directory>> announcers;
  for (std::size_t r = 0; r < replicas; ++r) {
    owners.push_back(std::make_unique<ObjectService>("tcp", object_count, object_size, object_name, config));
    announcers.push_back(std::make_unique<Directory>(owners.back()->io.get_executor(), directory_config));
    Announcement a;
    a.owner = OwnerEntry{"owner-" + std::to_string(r), "127.0.0.1", owners.back()->endpoint().port(), "bench", "tcp",
                         3, 0};
    a.names = owners.back()->names;
    must(announcers.back()->async_announce(std::move(a), asio::use_future).get(), "announce");
  }
  auto& first = *owners.front();
  auto& io = first.io;
  const auto& names = first.names;
  auto landing = OwnedBuffer::allocate(object_count * object_size);
  auto region = must(
      first.consumer_registry()->async_register(landing.bytes(), Access::local, asio::use_future).get(), "landing");
  std::vector<FetchSlot> slots;
  for (std::size_t i = 0; i < object_count; ++i) slots.push_back(FetchSlot{&region, i * object_size, object_size});

  auto single = first.connect();
  auto cluster = std::make_unique<ClusterConsumer>(io.get_executor(),
                                                   std::make_shared<Directory>(io.get_executor(), directory_config),
                                                   first.consumer_registry());
  auto from_cluster = [&]() -> asio::awaitable<void> {
    auto fetched = must(co_await cluster->async_fetch_many(names, slots), "cluster fetch_many");
    check(fetched.outcomes);
  };
  auto from_one = [&]() -> asio::awaitable<void> {
    check(must(co_await single->async_fetch_many(names, slots), "fetch_many"));
  };
  (void)time_awaits(io, 1, from_cluster);  // warm: peers, exports, keys, the directory's cache
  (void)time_awaits(io, 1, from_one);
  const std::size_t sets = std::max<std::size_t>(2, static_cast<std::size_t>(8 * options.bytes_scale));
  const double bytes = static_cast<double>(object_count * object_size * sets);
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(bytes / time_awaits(io, sets, from_cluster) / 1e9);
    m.raw.push_back(bytes / time_awaits(io, sets, from_one) / 1e9);
  }
  m.target = "ratio >= 0.80";
  m.target_met = m.ratio() >= 0.80;
  // Each Directory and the cluster consumer go on their own thread; the
  // consumers and guards of the first owner's registry before it.
  const auto on_thread = [](asio::io_context& context, const std::function<void()>& work) {
    std::promise<void> done;
    asio::post(context, [&] {
      work();
      done.set_value();
    });
    done.get_future().get();
  };
  on_thread(io, [&] { cluster.reset(); });
  for (std::size_t r = 0; r < replicas; ++r) on_thread(owners[r]->io, [&] { announcers[r].reset(); });
  single.reset();
  region = RegionGuard{};
  return m;
}

}  // namespace corma::bench
