// corma get: fetch one object from a corma serve and write it to a file.
#include "cluster_key.hpp"
#include "address.hpp"
#include "commands.hpp"
#include "directory_options.hpp"
#include "network_device.hpp"
#include "output_file.hpp"
#include "shut_down.hpp"
#include "sizes.hpp"

#include <corma/cluster_consumer.hpp>
#include <corma/consumer.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>

namespace corma::cli {

namespace asio = boost::asio;

namespace {

void draw_progress(std::uint64_t done, std::uint64_t total) {
  constexpr int width = 40;
  const int filled = total == 0 ? width : static_cast<int>(width * done / total);
  std::fprintf(stdout, "\r[%.*s%*s] %s / %s", filled, "########################################", width - filled, "",
               format_size(done).c_str(), format_size(total).c_str());
  std::fflush(stdout);
}

/// The owner to connect to: the one given, or (with a directory) the first
/// the directory names for the path, whose address also picks this side's
/// interface.
struct Target {
  asio::ip::tcp::endpoint owner;
  std::shared_ptr<Directory> directory;
};

Result<Target> find_target(asio::io_context& io, const GetOptions& options, const std::string& path) {
  if (options.directory.address.empty()) {
    CORMA_TRY(auto owner, parse_endpoint(options.owner));
    return Target{owner, nullptr};
  }
  CORMA_TRY(auto config, directory_config(options.directory));
  config.watch = false;  // one fetch: nothing to keep fresh
  config.on_rejected_entry = [](const std::string& owner, const Error& why) {
    std::fprintf(stderr, "corma get: skipped owner %s's directory entry: %s\n", owner.c_str(), why.message().c_str());
  };
  auto directory = std::make_shared<Directory>(io.get_executor(), config);
  auto resolving = directory->async_resolve(path, asio::use_future);
  io.run();
  io.restart();
  CORMA_TRY(auto owners, resolving.get());
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(owners.front().host, ec);
  if (ec) return fail(errc::peer_unreachable, "the directory names owner " + owners.front().id + " at '" + owners.front().host + "'");
  return Target{asio::ip::tcp::endpoint(address, owners.front().port), std::move(directory)};
}

/// `path` written by the owner into this side's mapping of the output (the
/// prefill→decode shape, from the command line): its size first (a range
/// of no bytes: one acquire and release), then the file mapped at that
/// size, registered, and offered for the push. An owner that takes no
/// pushes is read from into the same mapping, and the outcome says why.
asio::awaitable<Result<FetchOutcome>> push_into(Consumer& consumer, Registry& registry, const std::string& path,
                                                OutputFile& output) {
  CORMA_CO_TRY(auto sized, co_await consumer.async_fetch(path, ByteRange{0, 0}));
  CORMA_CO_TRY(auto landing, output.map(sized.size));
  if (sized.size == 0) co_return static_cast<FetchOutcome>(sized);  // nothing to write
  CORMA_CO_TRY(auto region, co_await registry.async_register(landing.memory, Access::remote_read_write,
                                                             asio::use_awaitable));
  auto pushed = co_await consumer.async_push_fetch(path, region);
  if (!pushed) {
    // A transfer given up may hold the mapping registered until the backend
    // lets go of it: the mapping stays until then.
    region.deregistered().async_wait([keep = landing.keepalive](Result<void>) {});
    co_return pushed;
  }
  (void)co_await region.async_deregister(asio::use_awaitable);
  // The file changed size since it was asked: a smaller one was written whole.
  if (pushed.value().size < sized.size) {
    CORMA_CO_TRY(output.truncate(pushed.value().size));
  }
  co_return pushed;
}

}  // namespace

int run_get(const GetOptions& options) {
  // With a directory the one positional argument is the path.
  const bool by_directory = !options.directory.address.empty();
  const std::string path = by_directory && options.path.empty() ? options.owner : options.path;
  asio::io_context io(1);
  auto target = find_target(io, options, path);
  auto budget = parse_size(options.budget);
  if (!target || !budget) {
    std::fprintf(stderr, "corma get: %s\n", (target ? budget.error() : target.error()).message().c_str());
    return target || target.error().is(errc::out_of_range) ? 2 : 1;
  }
  if (options.push && target.value().directory) {
    std::fprintf(stderr, "corma get: --push needs the server's address: a fetch through the directory reads\n");
    return 2;
  }
  const auto owner = target.value().owner;
  std::shared_ptr<Registry> registry;
  if (!options.no_rdma) {
    auto from = source_address_towards(owner);
    if (!from) {
      std::fprintf(stderr, "corma get: %s\n", from.error().message().c_str());
      return 1;
    }
    auto transport = options.transport;
    transport.local_address = from.value();
    auto backend = make_backend(transport);
    if (!backend) {
      std::fprintf(stderr, "corma get: %s\n", backend.error().message().c_str());
      return 1;
    }
    // A backend that may not expose memory makes no RDMA offer at all.
    if (backend.value().rma) {
      registry = std::make_shared<Registry>(backend.value().backend, RegistryConfig{budget.value(), 0});
    }
  }
  if (options.push && !registry) {
    std::fprintf(stderr, "corma get: --push needs a transport that exposes this side's memory (shm, verbs, or tcp "
                         "with --trusted-peers)\n");
    return 2;
  }

  ConsumerConfig config;
  config.pull_window = options.pull_window;
  if (!options.cluster_key_file.empty()) {
    auto key = read_cluster_key(options.cluster_key_file);
    if (!key) {
      std::fprintf(stderr, "corma get: %s\n", key.error().message().c_str());
      return 2;
    }
    config.cluster_key = std::move(key).value();
  }
  const bool terminal = ::isatty(STDOUT_FILENO) != 0;
  constexpr std::uint64_t progress_from = 16 << 20;
  if (terminal) {
    config.on_progress = [](std::uint64_t done, std::uint64_t total) {
      if (total >= progress_from) draw_progress(done, total);
    };
  }
  // Written as the chunks come (no buffer for the whole file on the chunked
  // path), an RDMA read landing in the file's mapping, and removed again if
  // the fetch fails.
  auto output = OutputFile::create(options.output);
  if (!output) {
    std::fprintf(stderr, "corma get: %s\n", output.error().message().c_str());
    return 1;
  }
  // One file thread writes the output's chunks while the loop reads the
  // next ones (the loop never waits for the disk).
  asio::thread_pool file_writer(1);
  const auto start = std::chrono::steady_clock::now();
  std::string served_by;
  auto fetch = [&]() -> asio::awaitable<Result<FetchOutcome>> {
    // Named, not a temporary inside the co_await: g++ 12 destroys those twice.
    auto destination = output.value().destination(file_writer.get_executor());
    if (target.value().directory) {
      ClusterConsumer cluster(io.get_executor(), target.value().directory, registry, config);
      ClusterFetchOptions which;
      which.version = options.version;
      CORMA_CO_TRY(auto outcome, co_await cluster.async_fetch_to(path, std::move(destination), which));
      served_by = (outcome.version ? ", version " + std::to_string(*outcome.version) : std::string()) + " from " +
                  outcome.owner;
      for (const auto& failed : outcome.failed) served_by += " (" + failed.owner + " failed: " + failed.error.message() + ")";
      co_return std::move(outcome.fetch);
    }
    CORMA_CO_TRY(auto consumer, co_await Consumer::connect(io.get_executor(), owner, registry, config));
    if (options.push) co_return co_await push_into(*consumer, *registry, path, output.value());
    co_return co_await consumer->async_fetch_to(path, std::move(destination));
  };
  std::optional<Result<FetchOutcome>> outcome;
  auto finished = start;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        outcome.emplace(co_await fetch());
        finished = std::chrono::steady_clock::now();
        // A transfer given up with a dead owner may keep its destination
        // registered until the backend lets go of it (UCX over shared
        // memory cannot end it at all): shutting the backend down ends it,
        // so the command never waits for a peer that will never answer.
        if (registry) (void)co_await shut_down(registry, "corma get");
      },
      asio::detached);
  io.run();
  auto fetched = outcome ? std::move(*outcome) : Result<FetchOutcome>(fail(errc::backend, "fetch did not finish"));
  const double seconds = std::chrono::duration<double>(finished - start).count();
  if (terminal) std::printf("\n");
  if (!fetched) {
    std::fprintf(stderr, "corma get: %s: %s\n", path.c_str(), fetched.error().message().c_str());
    return 1;
  }
  if (auto kept = output.value().keep(); !kept) {
    std::fprintf(stderr, "corma get: %s\n", kept.error().message().c_str());
    return 1;
  }
  const auto& f = fetched.value();
  const std::string windows = f.windows > 0 ? " in " + std::to_string(f.windows) + " windows" : "";
  const std::string reason = f.reason ? " (" + f.reason_text() + ")" : "";
  std::string push;
  if (f.pushed) {
    push = ", pushed by the server";
  } else if (options.push) {
    push = ", read: the push was refused (" + f.push_refusal + ")";
  }
  const std::string generation = f.generation ? ", generation " + std::to_string(*f.generation) : "";
  std::printf("corma get: %s -> %s: %s via %s%s%s%s%s%s, %.1f MB/s\n", path.c_str(), options.output.c_str(),
              format_size(f.size).c_str(), to_string(f.path), windows.c_str(), reason.c_str(), push.c_str(),
              generation.c_str(), served_by.c_str(), static_cast<double>(f.size) / seconds / 1e6);
  return 0;
}

}  // namespace corma::cli
