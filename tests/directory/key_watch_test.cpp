// The directory's watch on etcd stops when told to, whatever it is waiting
// for: a member that accepts the connection and never answers the TLS
// handshake holds the watch inside its connect, where there is no stream yet
// to close; stopping it there ends it at once, not at the connect's 5 s
// deadline, so an io_context a library user runs to completion is not kept
// busy after its Directory has gone.
#include "directory/etcd_stream.hpp"
#include "directory/key_watch.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <gtest/gtest.h>

#include <array>
#include <chrono>

namespace {

namespace asio = boost::asio;
using corma::directory::KeyWatch;

TEST(KeyWatchStop, AWatchStoppedInsideItsTlsHandshakeEndsAtOnce) {
  asio::io_context io;
  asio::ip::tcp::acceptor silent(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::ip::tcp::socket accepted(io);
  corma::DirectoryConfig config;
  config.port = silent.local_endpoint().port();
  config.tls = true;
  auto watch = std::make_shared<KeyWatch>(io.get_executor(), corma::directory::access_of(config), "/watched",
                                          std::chrono::milliseconds(100), KeyWatch::Callbacks{});
  // The watch is inside its handshake once its first TLS bytes arrive.
  std::array<char, 64> hello{};
  bool handshaking = false;
  silent.async_accept(accepted, [&](boost::system::error_code accept_failed) {
    ASSERT_FALSE(accept_failed) << accept_failed.message();
    accepted.async_read_some(asio::buffer(hello), [&](boost::system::error_code read_failed, std::size_t) {
      handshaking = !read_failed;
      io.stop();
    });
  });
  watch->start();
  io.run_for(std::chrono::seconds(4));
  ASSERT_TRUE(handshaking) << "the watch never began its TLS handshake";

  watch->stop();
  io.restart();
  const auto stopped = std::chrono::steady_clock::now();
  io.run_for(std::chrono::seconds(10));  // returns once nothing is left to run
  const auto took = std::chrono::steady_clock::now() - stopped;
  EXPECT_TRUE(io.stopped());
  EXPECT_LT(took, std::chrono::seconds(2)) << "the stopped watch waited for its connect's deadline";
}

}  // namespace
