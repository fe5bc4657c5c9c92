// A TCP proxy on loopback that holds every byte for a fixed time in each
// direction: a round trip of twice `delay` between a consumer and an owner
// of the same process, for tests that count round trips by the clock.
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

namespace corma::testing {

class DelayingProxy {
 public:
  DelayingProxy(boost::asio::io_context& io, boost::asio::ip::tcp::endpoint upstream, std::chrono::milliseconds delay)
      : acceptor_(io, {boost::asio::ip::make_address("127.0.0.1"), 0}), upstream_(upstream), delay_(delay) {
    boost::asio::co_spawn(io, accept(), boost::asio::detached);
  }

  [[nodiscard]] boost::asio::ip::tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }

 private:
  using tcp = boost::asio::ip::tcp;

  /// Bytes read from one side, due on the other at `due`.
  struct Held {
    std::chrono::steady_clock::time_point due;
    std::vector<char> bytes;
  };
  struct Direction {
    std::deque<Held> held;
    bool reading = true;
  };

  boost::asio::awaitable<void> accept() {
    for (;;) {
      auto [ec, downstream] = co_await acceptor_.async_accept(boost::asio::as_tuple(boost::asio::use_awaitable));
      if (ec) co_return;
      auto up = std::make_shared<tcp::socket>(acceptor_.get_executor());
      auto [connect_ec] = co_await up->async_connect(upstream_, boost::asio::as_tuple(boost::asio::use_awaitable));
      if (connect_ec) continue;
      auto down = std::make_shared<tcp::socket>(std::move(downstream));
      pump(down, up);
      pump(up, down);
    }
  }

  /// From `from` to `to`, each read held for the delay, in order.
  void pump(std::shared_ptr<tcp::socket> from, std::shared_ptr<tcp::socket> to) {
    auto direction = std::make_shared<Direction>();
    auto wake = std::make_shared<boost::asio::steady_timer>(from->get_executor());
    const auto delay = delay_;
    boost::asio::co_spawn(
        from->get_executor(),
        [from, direction, wake, delay]() -> boost::asio::awaitable<void> {
          std::vector<char> buffer(64 * 1024);
          for (;;) {
            auto [ec, n] = co_await from->async_read_some(boost::asio::buffer(buffer),
                                                          boost::asio::as_tuple(boost::asio::use_awaitable));
            if (ec) break;
            direction->held.push_back(
                Held{std::chrono::steady_clock::now() + delay, std::vector<char>(buffer.begin(), buffer.begin() + n)});
            wake->cancel();
          }
          direction->reading = false;
          wake->cancel();
        },
        boost::asio::detached);
    boost::asio::co_spawn(
        to->get_executor(),
        [to, direction, wake]() -> boost::asio::awaitable<void> {
          for (;;) {
            if (direction->held.empty()) {
              if (!direction->reading) break;
              wake->expires_at(std::chrono::steady_clock::time_point::max());
            } else {
              wake->expires_at(direction->held.front().due);
            }
            (void)co_await wake->async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
            while (!direction->held.empty() && direction->held.front().due <= std::chrono::steady_clock::now()) {
              const auto bytes = std::move(direction->held.front().bytes);
              direction->held.pop_front();
              auto [ec, n] = co_await boost::asio::async_write(*to, boost::asio::buffer(bytes),
                                                               boost::asio::as_tuple(boost::asio::use_awaitable));
              if (ec) co_return;
            }
          }
          boost::system::error_code ignored;
          to->shutdown(tcp::socket::shutdown_send, ignored);
        },
        boost::asio::detached);
  }

  tcp::acceptor acceptor_;
  tcp::endpoint upstream_;
  std::chrono::milliseconds delay_;
};

}  // namespace corma::testing
