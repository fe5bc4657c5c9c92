#include "push_fetch.hpp"

#include "object_service.hpp"
#include "raw_ucx.hpp"

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t object_size = MiB;

OwnerConfig pushing() {
  OwnerConfig config;
  config.accept_push = true;
  return config;
}

}  // namespace

Measurement push_fetch(const Options& options, const std::string& transport) {
  Measurement m{"push_fetch", transport, "size=1MiB warm", "GB/s", true, {}, {}, {}, true};
  m.baseline = "raw UCX put + flush";
  ObjectService service(transport, 1, object_size, [](std::size_t) { return std::string("object"); }, pushing());
  auto consumer = service.connect();
  auto landing_memory = OwnedBuffer::allocate(object_size);
  auto landing = must(
      service.consumer_registry()->async_register(landing_memory.bytes(), Access::remote_read_write, asio::use_future)
          .get(),
      "landing");
  const std::string name = service.names.front();
  auto push_once = [&]() -> asio::awaitable<void> {
    auto pushed = must(co_await consumer->async_push_fetch(name, landing), "push fetch");
    if (!pushed.pushed) throw std::runtime_error("the owner did not push: " + pushed.push_refusal);
  };
  (void)time_awaits(service.io, 1, push_once);  // warm: push peer set up, export registered

  auto source = OwnedBuffer::allocate(object_size);
  std::memset(source.data(), 7, object_size);
  auto raw_target = OwnedBuffer::allocate(object_size);
  RawPair raw(transport, raw_target.data(), object_size);
  const std::size_t count = std::max<std::size_t>(8, static_cast<std::size_t>(256 * options.bytes_scale));
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(object_size * count) / time_awaits(service.io, count, push_once) / 1e9);
    RawProgressThread target(raw.target);  // the target serves emulated puts only while progressed
    const double raw_seconds = raw_batches(raw.initiator, raw.ep, source.data(),
                                           reinterpret_cast<std::uint64_t>(raw.remote_memory), raw.rkey, object_size,
                                           1, count, true);
    m.raw.push_back(static_cast<double>(object_size * count) / raw_seconds / 1e9);
  }
  m.target = "ratio >= 0.80";
  m.target_met = m.ratio() >= 0.80;
  consumer.reset();
  landing = RegionGuard{};
  return m;
}

}  // namespace corma::bench
