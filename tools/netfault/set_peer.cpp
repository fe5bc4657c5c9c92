// corma-set-peer: one side of a set of objects moved between two processes,
// for the runs across a faulty link (the netfault tests and corma-bench's
// rows across a round trip), where the `corma` command has no verb for it.
//
//   corma-set-peer owner HOST:PORT [--trusted] [--count N] [--size BYTES]
//   corma-set-peer consumer HOST:PORT (many|push) [--trusted] [--count N]
//                  [--size BYTES] [--rounds R]
//
// The owner publishes N objects of BYTES bytes (object i's byte at offset o
// is a function of i and o), over trusted tcp (RDMA) or chunks only, and
// takes pushes; it prints "listening on HOST:PORT" and serves until killed.
// The consumer fetches the whole set R times, with one async_fetch_many or
// with a push fetch per object, checks every byte and prints "seconds S" for
// each round; on the first failure it prints the object and the error and
// exits 1.
#include <corma/consumer.hpp>
#include <corma/owned_buffer.hpp>
#include <corma/owner.hpp>
#include <corma/registry.hpp>
#include <corma/ucx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace asio = boost::asio;

struct Options {
  std::string role;
  std::string address;
  std::string mode = "many";
  bool trusted = false;
  std::size_t count = 1000;
  std::size_t size = 64 * 1024;
  int rounds = 1;
};

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr,
               "corma-set-peer: %s\nusage: corma-set-peer owner HOST:PORT [--trusted] [--count N] [--size BYTES]\n"
               "       corma-set-peer consumer HOST:PORT (many|push) [--trusted] [--count N] [--size BYTES] "
               "[--rounds R]\n",
               problem);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  if (argc < 3) usage("a role and an address are needed");
  Options options{argv[1], argv[2]};
  int i = 3;
  if (options.role == "consumer") {
    if (argc < 4) usage("a consumer needs a mode");
    options.mode = argv[i++];
    if (options.mode != "many" && options.mode != "push") usage("the mode is many or push");
  } else if (options.role != "owner") {
    usage("the role is owner or consumer");
  }
  for (; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--trusted") {
      options.trusted = true;
      continue;
    }
    if (i + 1 >= argc) usage("an option without its value");
    const auto value = std::strtoull(argv[++i], nullptr, 10);
    if (value == 0) usage("a count, size or number of rounds is at least 1");
    if (option == "--count") {
      options.count = value;
    } else if (option == "--size") {
      options.size = value;
    } else if (option == "--rounds") {
      options.rounds = static_cast<int>(value);
    } else {
      usage("unknown option");
    }
  }
  return options;
}

std::byte expected_byte(std::size_t object, std::size_t offset) {
  return static_cast<std::byte>((object * 131 + offset * 7 + (offset >> 12)) & 0xff);
}

std::string object_name(std::size_t i) { return "set/object-" + std::to_string(i); }

asio::ip::tcp::endpoint endpoint_of(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) usage("an address is HOST:PORT");
  return {asio::ip::make_address(text.substr(0, colon)), static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1)))};
}

/// A registry over UCX: trusted tcp on the device that holds `address`, or
/// (chunks only) shared memory, for local registrations.
std::shared_ptr<corma::Registry> registry_for(const Options& options, const asio::ip::address& address) {
  corma::ucx::Config config;
  config.transport = options.trusted ? corma::ucx::Transport::tcp : corma::ucx::Transport::shared_memory;
  config.error_handling = options.trusted ? corma::ucx::ErrorHandling::peer : corma::ucx::ErrorHandling::none;
  config.trusted_peers = options.trusted;
  if (options.trusted) config.tcp_interface = address.is_loopback() ? "lo" : "fault0";
  auto backend = corma::ucx::Backend::create(config);
  if (!backend) {
    std::fprintf(stderr, "corma-set-peer: %s\n", backend.error().message().c_str());
    std::exit(1);
  }
  return std::make_shared<corma::Registry>(std::move(backend).value(), corma::RegistryConfig{1ULL << 32, 0});
}

int serve(const Options& options) {
  asio::io_context io{1};
  auto objects = corma::OwnedBuffer::allocate(options.count * options.size);
  for (std::size_t i = 0; i < options.count; ++i) {
    for (std::size_t o = 0; o < options.size; ++o) objects.data()[i * options.size + o] = expected_byte(i, o);
  }
  const auto at = endpoint_of(options.address);
  corma::OwnerConfig config;
  config.rdma_threshold = options.size;
  config.accept_push = true;
  corma::Owner owner(io.get_executor(), options.trusted ? registry_for(options, at.address()) : nullptr, config);
  for (std::size_t i = 0; i < options.count; ++i) {
    owner.publish(object_name(i),
                  corma::PublishedObject{{objects.data() + i * options.size, options.size}, nullptr});
  }
  asio::ip::tcp::acceptor acceptor(io, at);
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);
  std::printf("listening on %s:%u\n", acceptor.local_endpoint().address().to_string().c_str(),
              acceptor.local_endpoint().port());
  std::fflush(stdout);
  io.run();
  return 0;
}

/// The first object of the landing that is not what the owner published.
std::optional<std::size_t> first_wrong(const Options& options, const std::byte* landing) {
  for (std::size_t i = 0; i < options.count; ++i) {
    for (std::size_t o = 0; o < options.size; ++o) {
      if (landing[i * options.size + o] != expected_byte(i, o)) return i;
    }
  }
  return std::nullopt;
}

asio::awaitable<int> consume(const Options& options, asio::io_context& io) {
  const auto peer = endpoint_of(options.address);
  const auto registry = registry_for(options, peer.address());
  auto connected = co_await corma::Consumer::connect(io.get_executor(), peer, registry);
  if (!connected) {
    std::printf("connect: %s\n", connected.error().message().c_str());
    co_return 1;
  }
  auto& consumer = *connected.value();
  auto landing = corma::OwnedBuffer::allocate(options.count * options.size);
  const auto access = options.mode == "push" ? corma::Access::remote_read_write : corma::Access::local;
  auto region = co_await registry->async_register(landing.bytes(), access, asio::use_awaitable);
  if (!region) {
    std::printf("landing: %s\n", region.error().message().c_str());
    co_return 1;
  }
  const auto expected_path = options.trusted ? corma::Path::rdma : corma::Path::chunked;
  for (int round = 0; round < options.rounds; ++round) {
    std::memset(landing.data(), 0, landing.size());
    const auto start = std::chrono::steady_clock::now();
    std::vector<corma::Result<corma::FetchOutcome>> outcomes;
    if (options.mode == "many") {
      std::vector<std::string> names;
      std::vector<corma::FetchSlot> slots;
      for (std::size_t i = 0; i < options.count; ++i) {
        names.push_back(object_name(i));
        slots.push_back(corma::FetchSlot{&region.value(), i * options.size, options.size});
      }
      auto fetched = co_await consumer.async_fetch_many(std::move(names), std::move(slots));
      if (!fetched) {
        std::printf("fetch_many: %s\n", fetched.error().message().c_str());
        co_return 1;
      }
      outcomes = std::move(fetched).value();
    } else {
      for (std::size_t i = 0; i < options.count; ++i) {
        corma::PushOptions push;
        push.offset = i * options.size;
        outcomes.push_back(co_await consumer.async_push_fetch(object_name(i), region.value(), push));
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      if (!outcomes[i]) {
        std::printf("object %zu: %s\n", i, outcomes[i].error().message().c_str());
        co_return 1;
      }
      const auto& outcome = outcomes[i].value();
      if (outcome.path != expected_path || (options.mode == "push" && options.trusted && !outcome.pushed)) {
        std::printf("object %zu: not the path asked for (%s%s)\n", i, outcome.reason_text().c_str(),
                    outcome.push_refusal.c_str());
        co_return 1;
      }
    }
    if (auto wrong = first_wrong(options, landing.data())) {
      std::printf("object %zu: wrong bytes\n", *wrong);
      co_return 1;
    }
    std::printf("seconds %.9f\n", seconds);
    std::fflush(stdout);
  }
  // Torn down in order before the io_context goes: the landing unmapped,
  // the connection closed, the registry (and its backend) shut down, so
  // that nothing of them is left to the io_context's destructor.
  (void)co_await region.value().async_deregister(asio::use_awaitable);
  connected.value().reset();
  if (auto down = co_await registry->async_shutdown(std::chrono::seconds(5), asio::use_awaitable); !down) {
    std::printf("shutdown: %s\n", down.error().message().c_str());
    co_return 1;
  }
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto options = parse(argc, argv);
  if (options.role == "owner") return serve(options);
  asio::io_context io{1};
  int status = 1;
  asio::co_spawn(io, consume(options, io), [&](std::exception_ptr error, int result) {
    status = error ? 1 : result;
    io.stop();
  });
  io.run();
  return status;
}
