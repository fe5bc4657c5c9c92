#include "fetch_many.hpp"

#include "bench_support.hpp"
#include "raw_ucx.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include <cstring>
#include <future>
#include <thread>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t object_count = 1000;
constexpr std::size_t object_size = 64 * KiB;

std::string object_name(std::size_t i) { return "kv/block-" + std::to_string(i); }

/// Seconds for `sets` fetches of the whole set, one after the other.
double fetch_sets(asio::io_context& io, Consumer& consumer, const std::vector<std::string>& names,
                  const std::vector<FetchSlot>& slots, std::size_t sets) {
  auto round = asio::co_spawn(
      io,
      [&]() -> asio::awaitable<double> {
        const auto start = clock_type::now();
        for (std::size_t s = 0; s < sets; ++s) {
          auto fetched = co_await consumer.async_fetch_many(names, slots);
          for (const auto& outcome : must(std::move(fetched), "fetch_many")) {
            if (!outcome || outcome.value().path != Path::rdma) throw std::runtime_error("an object missed RDMA");
          }
        }
        co_return std::chrono::duration<double>(clock_type::now() - start).count();
      },
      asio::use_future);
  return round.get();
}

}  // namespace

Measurement fetch_many_objects(const Options& options, const std::string& transport) {
  Measurement m{"fetch_many", transport, "objects=1000 size=64KiB warm", "GB/s", true, {}, {}, {}, true};
  constexpr std::size_t total = object_count * object_size;
  asio::io_context io(1);
  auto work = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  auto objects = OwnedBuffer::allocate(total);
  std::memset(objects.data(), 7, total);
  auto owner_registry = ucx_registry(transport, "owner backend");
  auto consumer_registry = ucx_registry(transport, "consumer backend");
  Owner owner(io.get_executor(), owner_registry);  // the default limits
  std::vector<std::string> names;
  for (std::size_t i = 0; i < object_count; ++i) {
    names.push_back(object_name(i));
    owner.publish(names.back(), PublishedObject{{objects.data() + i * object_size, object_size}, nullptr});
  }
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);
  auto consumer = must(Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, {},
                                         asio::use_future)
                           .get(),
                       "consumer");
  auto landing = OwnedBuffer::allocate(total);
  auto destination =
      must(consumer_registry->async_register(landing.bytes(), Access::local, asio::use_future).get(), "destination");
  std::vector<FetchSlot> slots;
  for (std::size_t i = 0; i < object_count; ++i) slots.push_back(FetchSlot{&destination, i * object_size, object_size});

  RawPair raw(transport, objects.data(), total);
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
  stop_serving(io, owner, acceptor);
  work.reset();
  runner.join();
  return m;
}

}  // namespace corma::bench
