// Links against an installed corma::directory: a Directory pointed at a
// port where no etcd listens answers a resolution with peer_unreachable
// (the etcd client, its JSON and its HTTP all linked in), and an address
// that is not one is refused before anything is sent.
#include <corma/directory.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_future.hpp>

#include <chrono>
#include <cstdio>

namespace asio = boost::asio;

int main() {
  if (corma::parse_directory_address("not an address")) {
    std::fprintf(stderr, "directory consumer: a malformed address was accepted\n");
    return 1;
  }
  asio::io_context io(1);
  // A port nobody listens on: taken, then let go.
  asio::ip::tcp::acceptor probe(io, {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = probe.local_endpoint().port();
  probe.close();

  corma::DirectoryConfig config;
  config.port = port;
  config.request_timeout = std::chrono::seconds(2);
  config.watch = false;
  corma::Directory directory(io.get_executor(), config);
  auto resolved = directory.async_resolve("model/layer-1", asio::use_future);
  io.run();
  const auto answer = resolved.get();
  if (answer || !answer.error().is(corma::errc::peer_unreachable)) {
    std::fprintf(stderr, "directory consumer: expected peer_unreachable without etcd, got %s\n",
                 answer ? "owners" : answer.error().message().c_str());
    return 1;
  }
  std::printf("directory consumer: no etcd at 127.0.0.1:%u, refused as peer_unreachable\n", port);
  return 0;
}
