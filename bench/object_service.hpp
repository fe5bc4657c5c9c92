// An owner serving a set of objects from this process's memory, with its
// own io_context thread, and what the fetch scenarios time over it.
#pragma once

#include "bench_support.hpp"

#include <corma/consumer.hpp>
#include <corma/owned_buffer.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace corma::bench {

/// `count` objects of `size` bytes named `name(i)`, published by an owner
/// over `transport` (exports kept registered: `config`'s default), on an
/// io_context thread of its own; consumers get a registry of their own.
class ObjectService {
 public:
  template <class Name>
  ObjectService(const std::string& transport, std::size_t count, std::size_t size, Name name,
                OwnerConfig config = {})
      : objects_(OwnedBuffer::allocate(count * size)),
        owner_registry_(ucx_registry(transport, "owner backend")),
        consumer_registry_(ucx_registry(transport, "consumer backend")),
        owner_(io.get_executor(), owner_registry_, config) {
    std::memset(objects_.data(), 7, count * size);
    for (std::size_t i = 0; i < count; ++i) {
      names.push_back(name(i));
      owner_.publish(names.back(), PublishedObject{{objects_.data() + i * size, size}, nullptr});
    }
    boost::asio::co_spawn(io, owner_.serve(acceptor_), boost::asio::detached);
    runner_ = std::thread([this] { io.run(); });
  }

  ObjectService(const ObjectService&) = delete;
  ObjectService& operator=(const ObjectService&) = delete;

  /// Consumers and guards of the consumers' registry must be gone first.
  ~ObjectService() {
    stop_serving(io, owner_, acceptor_);
    work_.reset();
    runner_.join();
  }

  [[nodiscard]] std::unique_ptr<Consumer> connect() {
    return must(Consumer::connect(io.get_executor(), acceptor_.local_endpoint(), consumer_registry_, {},
                                  boost::asio::use_future)
                    .get(),
                "consumer");
  }
  [[nodiscard]] const std::shared_ptr<Registry>& consumer_registry() const { return consumer_registry_; }
  [[nodiscard]] boost::asio::ip::tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }
  [[nodiscard]] std::byte* objects() { return objects_.data(); }

  boost::asio::io_context io{1};
  std::vector<std::string> names;

 private:
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ = boost::asio::make_work_guard(io);
  OwnedBuffer objects_;
  std::shared_ptr<Registry> owner_registry_;
  std::shared_ptr<Registry> consumer_registry_;
  Owner owner_;
  boost::asio::ip::tcp::acceptor acceptor_{io, {boost::asio::ip::make_address("127.0.0.1"), 0}};
  std::thread runner_;
};

/// Seconds that `times` awaits of `step()`, one after the other on `io`'s
/// thread, take.
template <class Step>
double time_awaits(boost::asio::io_context& io, std::size_t times, Step step) {
  auto timed = boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<double> {
        const auto start = clock_type::now();
        for (std::size_t i = 0; i < times; ++i) co_await step();
        co_return std::chrono::duration<double>(clock_type::now() - start).count();
      },
      boost::asio::use_future);
  return timed.get();
}

}  // namespace corma::bench
