// A program that only fetches: it links corma::corma for the Consumer and
// must carry no part of the Owner (scripts/check-install looks for the
// owner's symbols in it). It connects where nobody listens and expects to
// be told so.
#include <corma/consumer.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdio>

int main() {
  boost::asio::io_context io;
  // Port 1 on loopback: nothing listens there, the connection is refused.
  const boost::asio::ip::tcp::endpoint nobody(boost::asio::ip::make_address("127.0.0.1"), 1);
  auto connecting = corma::Consumer::connect(io.get_executor(), nobody, nullptr, {}, boost::asio::use_future);
  io.run();
  auto consumer = connecting.get();
  if (consumer || !consumer.error().is(corma::errc::peer_unreachable)) {
    std::fprintf(stderr, "fetch_only: connecting to a closed port did not answer peer_unreachable\n");
    return 1;
  }
  std::printf("fetch_only: %s\n", consumer.error().message().c_str());
  return 0;
}
