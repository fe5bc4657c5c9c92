#include "fetch_many.hpp"

#include "object_service.hpp"
#include "raw_ucx.hpp"

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t object_count = 1000;
constexpr std::size_t object_size = 64 * KiB;

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

Measurement fetch_many_objects(const Options& options, const std::string& transport) {
  Measurement m{"fetch_many", transport, "objects=1000 size=64KiB warm", "GB/s", true, {}, {}, {}, true};
  constexpr std::size_t total = object_count * object_size;
  ObjectService service(transport, object_count, object_size, object_name);
  auto& io = service.io;
  const auto& names = service.names;
  auto consumer = service.connect();
  auto landing = OwnedBuffer::allocate(total);
  auto destination = must(
      service.consumer_registry()->async_register(landing.bytes(), Access::local, asio::use_future).get(),
      "destination");
  std::vector<FetchSlot> slots;
  for (std::size_t i = 0; i < object_count; ++i) slots.push_back(FetchSlot{&destination, i * object_size, object_size});

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
  m.target = "ratio >= 0.80";
  m.target_met = m.ratio() >= 0.80;

  consumer.reset();
  destination = RegionGuard{};
  return m;
}

}  // namespace corma::bench
