// corma serve: an Owner over the files of one directory.
#include "address.hpp"
#include "commands.hpp"
#include "file_resolver.hpp"
#include "metrics_server.hpp"
#include "sizes.hpp"

#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <cstdio>
#include <optional>

namespace corma::cli {

namespace asio = boost::asio;

int run_serve(const ServeOptions& options) {
  auto resolver = FileResolver::create(options.root);
  auto budget = parse_size(options.budget);
  auto listen = parse_endpoint(options.listen);
  for (const auto* error : {resolver ? nullptr : &resolver.error(), budget ? nullptr : &budget.error(),
                            listen ? nullptr : &listen.error()}) {
    if (error != nullptr) {
      std::fprintf(stderr, "corma serve: %s\n", error->message().c_str());
      return 2;
    }
  }
  auto transport = options.transport;
  transport.local_address = listen.value().address();
  auto backend = make_backend(transport);
  if (!backend) {
    std::fprintf(stderr, "corma serve: %s\n", backend.error().message().c_str());
    return 1;
  }
  auto registry = std::make_shared<Registry>(backend.value().backend, RegistryConfig{budget.value(), 0});

  asio::io_context io(1);
  Owner owner(io.get_executor(), registry);
  owner.set_resolver(std::move(resolver).value());

  asio::ip::tcp::acceptor acceptor(io);
  boost::system::error_code ec;
  acceptor.open(listen.value().protocol(), ec);
  if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(listen.value(), ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "corma serve: cannot listen on %s: %s\n", options.listen.c_str(), ec.message().c_str());
    return 1;
  }
  std::optional<asio::ip::tcp::acceptor> metrics;
  if (!options.metrics.empty()) {
    auto endpoint = parse_endpoint(options.metrics);
    if (!endpoint) {
      std::fprintf(stderr, "corma serve: %s\n", endpoint.error().message().c_str());
      return 2;
    }
    metrics.emplace(io, endpoint.value());
    asio::co_spawn(io, serve_metrics(*metrics, owner, registry.get()), asio::detached);
  }

  const auto bound = acceptor.local_endpoint();
  std::printf("corma serve: listening on %s:%u, root %s, budget %s, %s\n", bound.address().to_string().c_str(),
              bound.port(), options.root.c_str(), format_size(budget.value()).c_str(),
              backend.value().description.c_str());
  if (metrics) {
    std::printf("corma serve: metrics on http://%s:%u/metrics\n",
                metrics->local_endpoint().address().to_string().c_str(), metrics->local_endpoint().port());
  }
  std::fflush(stdout);

  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code, int) {
    owner.stop();
    acceptor.close();
    if (metrics) metrics->close();
    io.stop();
  });
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);
  io.run();
  std::printf("corma serve: stopped\n");
  return 0;
}

}  // namespace corma::cli
