#include "fetch_many.hpp"

#include "object_service.hpp"
#include "raw_ucx.hpp"

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t object_count = 1000;

std::string object_name(std::size_t i) { return "kv/block-" + std::to_string(i); }

/// Seconds for `sets` fetches of the whole set, one after the other.
double fetch_sets(asio::io_context& io, Consumer& consumer, const std::vector<std::string>& names,
                  const std::vector<FetchSlot>& slots, std::size_t sets) {
  return time_awaits(io, sets, [&]() -> asio::awaitable<void> {
    auto fetched = co_await consumer.async_fetch_many(names, slots);
    for (const auto& outcome : must(std::move(fetched), "fetch_many")) {
      if (!outcome || outcome.value().path != Path::rdma) throw std::runtime_error("an object missed RDMA");
    }
  });
}

}  // namespace

Measurement fetch_many_objects(const Options& options, const std::string& transport, std::size_t object_size,
                               bool into_arena) {
  Measurement m{"fetch_many", transport,
                "objects=1000 size=" + size_name(object_size) + " warm" + (into_arena ? " arena" : ""), "GB/s", true,
                {}, {}, {}, true};
  const std::size_t total = object_count * object_size;
  OwnerConfig config;
  config.rdma_threshold = std::min<std::uint64_t>(config.rdma_threshold, object_size);  // every object by RDMA
  ObjectService service(transport, object_count, object_size, object_name, config);
  auto& io = service.io;
  const auto& names = service.names;
  auto consumer = service.connect();
  // The landing: slices of an arena, or one region kept registered.
  auto landing = OwnedBuffer::allocate(total);
  Arena arena;
  std::vector<RegionGuard> destinations;
  std::vector<FetchSlot> slots;
  destinations.reserve(into_arena ? object_count : 1);
  if (into_arena) {
    arena = must(service.consumer_registry()->async_make_arena(total, ArenaConfig{}, asio::use_future).get(), "arena");
    for (std::size_t i = 0; i < object_count; ++i) {
      destinations.push_back(must(arena.allocate(object_size), "slice"));
      slots.push_back(FetchSlot{&destinations.back(), 0, object_size});
    }
  } else {
    destinations.push_back(must(
        service.consumer_registry()->async_register(landing.bytes(), Access::local, asio::use_future).get(),
        "destination"));
    for (std::size_t i = 0; i < object_count; ++i) {
      slots.push_back(FetchSlot{&destinations.back(), i * object_size, object_size});
    }
  }

  RawPair raw(transport, service.objects(), total);
  auto raw_landing = OwnedBuffer::allocate(total);
  const std::size_t sets = std::max<std::size_t>(2, static_cast<std::size_t>(8 * options.bytes_scale));
  (void)fetch_sets(io, *consumer, names, slots, 1);  // warm: exports registered, keys imported
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(total * sets) / fetch_sets(io, *consumer, names, slots, sets) / 1e9);
    RawProgressThread target(raw.target);
    const double raw_seconds =
        raw_batches(raw.initiator, raw.ep, raw_landing.data(), reinterpret_cast<std::uint64_t>(raw.remote_memory),
                    raw.rkey, object_size, object_count, sets, false);
    m.raw.push_back(static_cast<double>(total * sets) / raw_seconds / 1e9);
  }
  const double floor = into_arena ? 0.70 : transport == "tcp" ? 0.90 : 0.80;
  m.target = "ratio >= " + std::to_string(floor).substr(0, 4);
  m.target_met = m.ratio() >= floor;

  consumer.reset();
  destinations.clear();
  return m;
}

}  // namespace corma::bench
