#include "registration_reuse.hpp"

#include "bench_support.hpp"
#include "raw_ucx.hpp"

#include <corma/arena.hpp>
#include <corma/owned_buffer.hpp>

#include <boost/asio/use_future.hpp>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t slice = 4 * KiB;

int operations(const Options& options) { return static_cast<int>(20000 * options.bytes_scale) + 500; }

}  // namespace

Measurement cached_registration(const Options& options, const std::string& transport) {
  Measurement m{"registration", transport, "size=4KiB cached", "us", false, {}, {}, {}, true};
  auto memory = OwnedBuffer::allocate(64 * KiB);
  auto backend = must(ucx::Backend::create(corma_config(transport)), "corma backend");
  RegistryConfig config{1ULL << 30, 0};
  config.cache_registrations = true;
  Registry registry(backend, config);
  auto whole = must(registry.async_register(memory.bytes(), Access::local, asio::use_future).get(), "cached region");
  RawWorker raw(raw_tls(transport));
  const int ops = operations(options);
  for (int r = 0; r < options.rounds; ++r) {
    const auto start = clock_type::now();
    for (int i = 0; i < ops; ++i) {
      auto offset = static_cast<std::size_t>(i % 16) * slice;
      auto guard = registry.find_cached(memory.bytes().subspan(offset, slice), Access::local);
      if (!guard) throw std::runtime_error(guard.error().message());
    }
    m.corma.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / ops);
    m.raw.push_back(raw_map_unmap_us(raw, memory.data(), slice, ops));
  }
  if (registry.stats().registrations != 1) throw std::runtime_error("a cached registration went to the backend");
  m.target = "median <= 0.25 x raw";
  m.target_met = m.corma_median() <= 0.25 * m.raw_median();
  whole = RegionGuard{};
  (void)registry.async_shutdown(std::chrono::seconds(5), asio::use_future).get();
  return m;
}

Measurement arena_allocate(const Options& options, const std::string& transport) {
  Measurement m{"arena_allocate", transport, "size=4KiB", "us", false, {}, {}, {}, true};
  auto backend = must(ucx::Backend::create(corma_config(transport)), "corma backend");
  Registry registry(backend, RegistryConfig{1ULL << 30, 0});
  auto arena = must(registry.async_make_arena(1 * MiB, ArenaConfig{}, asio::use_future).get(), "arena");
  auto raw_memory = OwnedBuffer::allocate(slice);
  RawWorker raw(raw_tls(transport));
  const int ops = operations(options) * 10;
  for (int r = 0; r < options.rounds; ++r) {
    const auto start = clock_type::now();
    for (int i = 0; i < ops; ++i) {
      auto taken = arena.allocate(slice);
      if (!taken) throw std::runtime_error(taken.error().message());
    }
    m.corma.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / ops);
    m.raw.push_back(raw_map_unmap_us(raw, raw_memory.data(), slice, operations(options)));
  }
  m.target = "median <= 0.10 x raw";
  m.target_met = m.corma_median() <= 0.10 * m.raw_median();
  arena = Arena{};
  (void)registry.async_shutdown(std::chrono::seconds(5), asio::use_future).get();
  return m;
}

}  // namespace corma::bench
