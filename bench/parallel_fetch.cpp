#include "parallel_fetch.hpp"

#include "object_service.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t fetch_count = 8;
constexpr std::size_t object_size = MiB;

/// Fetch i of one round: `names[i]` into `destinations[i]` over `consumers[i]`.
struct Round {
  std::vector<Consumer*> consumers;
  const std::vector<std::string>& names;
  std::vector<RegionGuard>& destinations;
};

/// The round's fetches, all at once; returns when every one has landed.
asio::awaitable<void> fetch_all(const Round& round) {
  auto executor = co_await asio::this_coro::executor;
  std::size_t left = round.names.size();
  asio::steady_timer all_landed(executor, asio::steady_timer::time_point::max());
  for (std::size_t i = 0; i < round.names.size(); ++i) {
    asio::co_spawn(
        executor,
        [&, i]() -> asio::awaitable<void> {
          auto fetched = co_await round.consumers[i]->async_fetch_into(round.names[i], round.destinations[i]);
          if (must(std::move(fetched), "fetch").path != Path::rdma) throw std::runtime_error("a fetch missed RDMA");
          if (--left == 0) all_landed.cancel();
        },
        asio::detached);
  }
  if (left != 0) (void)co_await all_landed.async_wait(asio::as_tuple(asio::use_awaitable));
}

/// Seconds for `rounds` rounds, one after the other.
double fetch_rounds(asio::io_context& io, const Round& round, std::size_t rounds) {
  return time_awaits(io, rounds, [&] { return fetch_all(round); });
}

}  // namespace

Measurement parallel_fetch(const Options& options, const std::string& transport) {
  Measurement m{"parallel_fetch", transport, "consumers=1 fetches=8 size=1MiB warm", "GB/s", true, {}, {}, {}, true};
  m.baseline = "eight consumers";
  constexpr std::size_t total = fetch_count * object_size;
  ObjectService service(transport, fetch_count, object_size, [](std::size_t i) { return "block-" + std::to_string(i); });
  auto& io = service.io;
  auto alone = service.connect();
  std::vector<std::unique_ptr<Consumer>> eight;
  for (std::size_t i = 0; i < fetch_count; ++i) eight.push_back(service.connect());
  auto landing = OwnedBuffer::allocate(total);
  std::vector<RegionGuard> destinations;
  for (std::size_t i = 0; i < fetch_count; ++i) {
    std::span<std::byte> slice(landing.data() + i * object_size, object_size);
    destinations.push_back(must(
        service.consumer_registry()->async_register(slice, Access::local, asio::use_future).get(), "destination"));
  }
  const auto& names = service.names;
  const Round one_connection{std::vector<Consumer*>(fetch_count, alone.get()), names, destinations};
  Round eight_connections{{}, names, destinations};
  for (auto& consumer : eight) eight_connections.consumers.push_back(consumer.get());

  const std::size_t rounds = std::max<std::size_t>(4, static_cast<std::size_t>(32 * options.bytes_scale));
  (void)fetch_rounds(io, one_connection, 1);  // warm: exports registered, peers wired up
  (void)fetch_rounds(io, eight_connections, 1);
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(total * rounds) / fetch_rounds(io, one_connection, rounds) / 1e9);
    m.raw.push_back(static_cast<double>(total * rounds) / fetch_rounds(io, eight_connections, rounds) / 1e9);
  }
  m.target = "ratio >= 0.90";
  m.target_met = m.ratio() >= 0.90;

  alone.reset();
  eight.clear();
  destinations.clear();
  return m;
}

}  // namespace corma::bench
