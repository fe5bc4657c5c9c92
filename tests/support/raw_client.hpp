// A client that speaks the rendezvous protocol frame by frame, for tests that
// play a hostile or unusual consumer. Needs src/ on the include path.
#pragma once

#include "rendezvous/protocol/framed_connection.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <memory>
#include <utility>

namespace corma::testing {

struct RawClient {
  std::unique_ptr<rendezvous::FramedConnection> connection;
  std::uint64_t next = 1;

  static boost::asio::awaitable<RawClient> connect(boost::asio::ip::tcp::endpoint endpoint) {
    boost::asio::ip::tcp::socket socket(co_await boost::asio::this_coro::executor);
    co_await socket.async_connect(endpoint, boost::asio::use_awaitable);
    RawClient client;
    client.connection =
        std::make_unique<rendezvous::FramedConnection>(std::move(socket), rendezvous::default_max_frame_body);
    co_return client;
  }

  /// Sends one request and reads the frame that answers it.
  boost::asio::awaitable<Result<rendezvous::Message>> ask(rendezvous::Message message) {
    rendezvous::Frame frame{next++, std::move(message)};
    auto written = co_await connection->write(frame, std::chrono::seconds(5));
    if (!written) co_return std::move(written).error();
    auto reply = co_await connection->read(std::chrono::seconds(5));
    if (!reply) co_return std::move(reply).error();
    co_return std::move(reply.value().message);
  }
};

/// Builds the request outside the co_await expression: g++ 12 destroys
/// braced temporaries inside co_await expressions twice.
template <class T>
rendezvous::Message message(T&& body) {
  return rendezvous::Message(std::forward<T>(body));
}

}  // namespace corma::testing
