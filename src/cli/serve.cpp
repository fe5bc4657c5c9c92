// corma serve: an Owner over the files of one directory.
#include "address.hpp"
#include "announced_files.hpp"
#include "commands.hpp"
#include "cluster_key.hpp"
#include "directory_options.hpp"
#include "file_resolver.hpp"
#include "metrics_server.hpp"
#include "shut_down.hpp"
#include "sizes.hpp"

#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstdio>
#include <optional>

namespace corma::cli {

namespace asio = boost::asio;

namespace {

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

}  // namespace

int run_serve(const ServeOptions& options) {
  auto snapshot_limit = parse_size(options.snapshot_limit);
  auto resolver = FileResolver::create(options.root, snapshot_limit ? snapshot_limit.value() : 0);
  auto budget = parse_size(options.budget);
  auto listen = parse_endpoint(options.listen);
  for (const auto* error : {snapshot_limit ? nullptr : &snapshot_limit.error(), resolver ? nullptr : &resolver.error(),
                            budget ? nullptr : &budget.error(), listen ? nullptr : &listen.error()}) {
    if (error != nullptr) {
      std::fprintf(stderr, "corma serve: %s\n", error->message().c_str());
      return 2;
    }
  }
  // Declared first, destroyed last: nothing that may still post into it
  // (registry, backend) outlives it.
  asio::io_context io(1);
  auto transport = options.transport;
  transport.local_address = listen.value().address();
  auto backend = make_backend(transport);
  if (!backend) {
    std::fprintf(stderr, "corma serve: %s\n", backend.error().message().c_str());
    return 1;
  }
  auto registry = std::make_shared<Registry>(backend.value().backend, RegistryConfig{budget.value(), 0});

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
  OwnerConfig owner_config;
  if (!options.cluster_key_file.empty()) {
    auto key = read_cluster_key(options.cluster_key_file);
    if (!key) {
      std::fprintf(stderr, "corma serve: %s\n", key.error().message().c_str());
      return 2;
    }
    owner_config.cluster_key = std::move(key).value();
    owner_config.owner_id = serve_owner_id(options, acceptor.local_endpoint().port());
    if (owner_config.owner_id.size() > 255) {  // what a proof can carry
      std::fprintf(stderr, "corma serve: an owner id that proves itself is at most 255 bytes\n");
      return 2;
    }
  }
  owner_config.max_connections = options.max_connections;
  owner_config.max_leases = options.max_leases;
  owner_config.max_handshakes = options.max_handshakes;
  owner_config.lease_timeout = milliseconds(options.lease_timeout_s);
  owner_config.io_timeout = milliseconds(options.io_timeout_s);
  owner_config.idle_timeout = milliseconds(options.idle_timeout_s);
  owner_config.accept_push = options.accept_push;
  Owner owner(io.get_executor(), registry, owner_config);
  const auto files = std::move(resolver).value();
  // Files are read into snapshots on threads of their own: the event loop
  // serves every connection and must never wait for a disk. Destroyed
  // (joined) before `io`, into which they answer.
  asio::thread_pool file_readers(options.file_threads);
  owner.set_resolver(
      [files, readers = file_readers.get_executor()](std::string name, ResolveHandler done) {
        files.resolve(std::move(name), readers, std::move(done));
      },
      [files] { files.refresh(); });

  std::optional<Directory> directory;
  if (!options.directory.address.empty()) {
    auto config = directory_config(options.directory);
    if (!config) {
      std::fprintf(stderr, "corma serve: %s\n", config.error().message().c_str());
      return 2;
    }
    directory.emplace(io.get_executor(), config.value());
  }
  std::optional<FileAnnouncer> file_announcer;
  std::optional<asio::ip::tcp::acceptor> metrics;
  if (!options.metrics.empty()) {
    auto endpoint = parse_endpoint(options.metrics);
    if (!endpoint) {
      std::fprintf(stderr, "corma serve: %s\n", endpoint.error().message().c_str());
      return 2;
    }
    metrics.emplace(io, endpoint.value());
    asio::co_spawn(io, serve_metrics(*metrics, owner, registry.get(), directory ? &*directory : nullptr),
                   asio::detached);
  }

  const auto bound = acceptor.local_endpoint();
  // Pushes need memory this side can expose and --accept-push; say which is missing.
  const char* pushes = !backend.value().rma       ? "pushes refused (this transport exposes no memory)"
                       : options.accept_push ? "pushes accepted"
                                             : "pushes refused (--accept-push takes them)";
  std::printf("corma serve: listening on %s:%u, root %s, budget %s, %s, %u file threads, %s\n",
              bound.address().to_string().c_str(), bound.port(), options.root.c_str(),
              format_size(budget.value()).c_str(), backend.value().description.c_str(), options.file_threads, pushes);
  if (!owner_config.cluster_key.empty()) {
    std::printf("corma serve: proves to consumers that it is '%s', holding the cluster key\n",
                owner_config.owner_id.c_str());
  }
  if (metrics) {
    std::printf("corma serve: metrics on http://%s:%u/metrics\n",
                metrics->local_endpoint().address().to_string().c_str(), metrics->local_endpoint().port());
  }
  if (directory) {
    auto announcement = serve_announcement(options, bound, backend.value().rma);
    // The load consumers rank owners by: what this owner is serving now.
    announcement.current_load = [&owner] {
      const auto stats = owner.stats();
      return stats.live_leases + stats.open_connections;
    };
    std::printf("corma serve: announcing %s in the directory at %s under %s\n", announcement.owner.id.c_str(),
                options.directory.address.c_str(), options.directory.key_prefix.c_str());
    // Announced in the background: an owner serves whether or not etcd is up.
    if (options.announce_files) {
      file_announcer.emplace(io.get_executor(), file_readers.get_executor(), *directory, announcement,
                             options.root, std::chrono::milliseconds(static_cast<long>(options.announce_rescan_s * 1000)));
      file_announcer->start([id = announcement.owner.id, last_error = std::string()](const Result<void>& announced,
                                                                                      std::size_t named) mutable {
        if (!announced) {
          // Said once until it changes: a scan runs every few seconds.
          if (announced.error().message() == last_error) return;
          last_error = announced.error().message();
          std::fprintf(stderr, "corma serve: not announced: %s\n", last_error.c_str());
          return;
        }
        last_error.clear();
        std::printf("corma serve: announced %s, %zu files by name with their versions\n", id.c_str(), named);
        std::fflush(stdout);
      });
    } else {
      directory->async_announce(announcement, [id = announcement.owner.id](Result<void> announced) {
        if (!announced) {
          std::fprintf(stderr, "corma serve: not announced: %s\n", announced.error().message().c_str());
          return;
        }
        std::printf("corma serve: announced %s\n", id.c_str());
        std::fflush(stdout);
      });
    }
  }
  std::fflush(stdout);

  // Shutdown: stop serving (connections closed, leases dropped), then the
  // backend, then the registry (shut_down); the io_context runs until all of
  // it is answered, and is destroyed only after both are done. The backend
  // goes before the served bytes: UCX over shared memory and tcp serves a
  // peer's get by copying from the target address on this side's progress
  // thread, whether or not that memory is still registered, so memory
  // released while the backend still serves peers could be read after it
  // was freed.
  bool clean = false;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  auto stop_serving = [&]() -> asio::awaitable<bool> {
    // Withdrawn first, so that consumers stop choosing this owner (bounded
    // by the directory's request timeout when etcd is down).
    if (file_announcer) file_announcer->stop();
    if (directory) (void)co_await directory->async_withdraw(asio::use_awaitable);
    owner.stop();
    acceptor.close();
    if (metrics) metrics->close();
    co_return co_await shut_down(registry, "corma serve");
  };
  signals.async_wait([&](boost::system::error_code signalled, int) {
    if (signalled) return;
    asio::co_spawn(io, stop_serving(), [&](std::exception_ptr, bool ok) {
      clean = ok;
      io.stop();
    });
  });
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);
  io.run();
  // Answers given at once to calls refused during the shutdown are posted
  // to `io` (some through the backend's progress thread) and may still be
  // on their way: each holds work on `io`, so running it until it is out of work (bounded)
  // delivers them here, before `io` is destroyed.
  io.restart();
  io.run_for(std::chrono::seconds(2));
  const auto live = backend.value().backend->live_registrations();
  std::printf("corma serve: stopped; %zu live registrations\n", live.value_or(0));
  return clean && live.value_or(0) == 0 ? 0 : 1;
}

}  // namespace corma::cli
