// A registry over a UCX backend peered with another one, hundreds of
// operations of every kind in flight (gets, puts, registrations, owned
// registrations, deregistered() waits, deregistrations, guards dropped under
// their transfers), then the registry and the backend shut down in one of
// the documented orders. Public headers only, run as a child process by
// tests/programs/shutdown_orders_test.cpp, so that a provider abort is a
// failed run and not a dead test runner.
//
//   corma-shutdown-orders ORDER TRANSPORT RUNS [--during-wire-up] [--with-target]
//     ORDER      same_tick | backend_first | registry_first |
//                backend_then_registry | registry_then_backend
//     TRANSPORT  tcp (trusted, on lo) | shm
//     --during-wire-up  no get round trip first: the operations start the
//                       endpoint's wire-up, and the shutdowns meet it
//     --with-target     the target backend shuts down at the same moment
//                       as the initiator (otherwise once the rest is done)
//
// Exits 0 when every run answered every caller exactly once and left the
// registry holding nothing; 1 (saying what) otherwise; 2 on a hang; a
// provider abort shows as the signal.
#include "programs/child.hpp"

#include <corma/registry.hpp>
#include <corma/ucx.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using corma::programs::fail_run;

constexpr std::size_t KiB = 1024;
constexpr std::size_t slice = 64 * KiB;
constexpr std::size_t guards = 64;

enum class Order { same_tick, backend_first, registry_first, backend_then_registry, registry_then_backend };

std::optional<Order> order_named(const std::string& name) {
  if (name == "same_tick") return Order::same_tick;
  if (name == "backend_first") return Order::backend_first;
  if (name == "registry_first") return Order::registry_first;
  if (name == "backend_then_registry") return Order::backend_then_registry;
  if (name == "registry_then_backend") return Order::registry_then_backend;
  return std::nullopt;
}

/// Every caller's answers, one slot each: how many, and whether each was a
/// success or an error of corma's own category.
class Tally : public std::enable_shared_from_this<Tally> {
 public:
  template <class T>
  auto slot() {
    std::lock_guard lock(mutex_);
    const std::size_t i = calls_.size();
    calls_.push_back(0);
    return [self = shared_from_this(), i](const Result<T>& r) { self->answered(i, r ? std::error_code{} : r.error().code); };
  }
  template <class T, class E>
  auto owned_slot() {
    std::lock_guard lock(mutex_);
    const std::size_t i = calls_.size();
    calls_.push_back(0);
    return [self = shared_from_this(), i](corma::Result<T, E> r) {
      self->answered(i, r ? std::error_code{} : make_error_code(r.error()));
    };
  }

  bool wait_all(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, limit, [this] { return answered_ >= calls_.size(); });
  }
  void check() {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < calls_.size(); ++i) {
      if (calls_[i] != 1) fail_run("caller " + std::to_string(i) + " answered " + std::to_string(calls_[i]) + " times");
    }
    if (!foreign_.empty()) fail_run("an answer outside corma's error category: " + foreign_);
  }
  std::size_t size() {
    std::lock_guard lock(mutex_);
    return calls_.size();
  }
  std::size_t answered() {
    std::lock_guard lock(mutex_);
    return answered_;
  }

 private:
  template <class T>
  using Result = corma::Result<T>;

  void answered(std::size_t i, std::error_code code) {
    std::lock_guard lock(mutex_);
    ++calls_[i];
    ++answered_;
    if (code && &code.category() != &corma::error_category()) foreign_ = code.message();
    changed_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int> calls_;
  std::size_t answered_ = 0;
  std::string foreign_;
};

std::shared_ptr<corma::ucx::Backend> make_backend(bool tcp) {
  corma::ucx::Config config;
  if (tcp) {
    config.transport = corma::ucx::Transport::tcp;
    config.error_handling = corma::ucx::ErrorHandling::peer;
    config.trusted_peers = true;
    config.tcp_interface = "lo";
  } else {
    config.transport = corma::ucx::Transport::shared_memory;
    config.error_handling = corma::ucx::ErrorHandling::none;
  }
  config.operation_timeout = 3s;
  config.shutdown_timeout = 2s;
  auto backend = corma::ucx::Backend::create(config);
  if (!backend) fail_run("backend: " + backend.error().message());
  return std::move(backend).value();
}

template <class T>
T wait_value(std::future<corma::Result<T>> future, const char* what) {
  if (future.wait_for(10s) != std::future_status::ready) fail_run(std::string(what) + ": no answer");
  auto r = future.get();
  if (!r) fail_run(std::string(what) + ": " + r.error().message());
  if constexpr (!std::is_void_v<T>) return std::move(r).value();
}

struct Options {
  Order order = Order::same_tick;
  bool tcp = true;
  bool during_wire_up = false;
  bool with_target = false;
};

void one_run(const Options& options) {
  const Order order = options.order;
  const bool tcp = options.tcp;
  asio::io_context io;  // outlives the backends, whose threads post into it
  auto initiator = make_backend(tcp);
  auto target = make_backend(tcp);
  auto offer = wait_value(initiator->async_peer_offer(asio::use_future), "peer offer");
  auto answer = wait_value(target->async_peer_accept(offer.blob, asio::use_future), "peer accept");
  wait_value<void>(initiator->async_peer_complete(offer.peer, answer.blob, asio::use_future), "peer complete");
  const corma::PeerId peer = offer.peer;

  auto remote_memory = corma::OwnedBuffer::allocate(guards * slice);
  std::memset(remote_memory.data(), 0x5a, remote_memory.size());
  auto remote_map = wait_value(target->async_map(remote_memory.data(), remote_memory.size(),
                                                 corma::Access::remote_read_write, asio::use_future),
                               "remote map");
  const corma::RemoteRegion remote{initiator->wire_id(), 1, reinterpret_cast<std::uint64_t>(remote_memory.data()),
                                   remote_memory.size(), remote_map.packed_key};

  corma::Registry registry(initiator, corma::RegistryConfig{.budget_bytes = 1024 * 1024 * 1024});
  auto local_memory = corma::OwnedBuffer::allocate(2 * guards * slice);
  std::vector<corma::RegionGuard> kept;
  std::vector<corma::DeregisteredEvent> events;
  for (std::size_t i = 0; i < guards; ++i) {
    corma::RegionGuard guard;
    if (i % 2 == 0) {
      auto owned = registry.async_register_owned(corma::OwnedBuffer::allocate(slice), corma::Access::local,
                                                 asio::use_future).get();
      if (!owned) fail_run("owned registration: " + owned.error().error.message());
      guard = std::move(owned).value();
    } else {
      guard = wait_value(registry.async_register(local_memory.bytes().subspan(i * slice, slice), corma::Access::local,
                                                 asio::use_future),
                         "registration");
    }
    events.push_back(guard.deregistered());
    kept.push_back(std::move(guard));
  }
  if (!options.during_wire_up) {
    // One get round trip: the endpoint's wire-up is over before anything else.
    wait_value<void>(kept[1].async_get(peer, remote, {0, 0, 64}, asio::use_future), "warm-up get");
  }

  auto tally = std::make_shared<Tally>();
  // Every guard: a get or a put (some dropped under it, some deregistered
  // after it), and a deregistered() wait.
  for (std::size_t i = 0; i < guards; ++i) {
    auto& guard = kept[i];
    for (int k = 0; k < 2; ++k) {
      const corma::TransferRange range{static_cast<std::uint64_t>(k) * (slice / 2), i * slice + k * (slice / 2), slice / 2};
      if ((i + k) % 4 == 3) {
        guard.async_put(peer, remote, range, tally->slot<void>());
      } else {
        guard.async_get(peer, remote, range, tally->slot<void>());
      }
    }
    events[i].async_wait(tally->slot<void>());
    events[i].async_wait(tally->slot<void>());
    if (i % 5 == 0) guard = corma::RegionGuard{};
    else if (i % 5 == 1) guard.async_deregister(tally->slot<void>());
  }
  // Registrations still in flight, of caller-owned and of owned memory.
  for (std::size_t i = 0; i < guards; ++i) {
    if (i % 2 == 0) {
      registry.async_register(local_memory.bytes().subspan((guards + i) * slice, slice), corma::Access::local,
                              [h = tally->slot<void>()](corma::Result<corma::RegionGuard> r) {
                                h(r ? corma::Result<void>(corma::success()) : corma::Result<void>(r.error()));
                              });
    } else {
      registry.async_register_owned(corma::OwnedBuffer::allocate(slice), corma::Access::local,
                                    tally->owned_slot<corma::RegionGuard, corma::OwnedRegistrationFailure>());
    }
  }

  std::promise<corma::Result<void>> registry_done;
  std::promise<corma::Result<void>> backend_done;
  auto registry_future = registry_done.get_future();
  auto backend_future = backend_done.get_future();
  auto registry_shutdown = [&] {
    registry.async_shutdown(10s, [&](corma::Result<void> r) { registry_done.set_value(std::move(r)); });
  };
  std::future<corma::Result<void>> target_down;
  auto backend_shutdown = [&] {
    initiator->async_shutdown([&](corma::Result<void> r) { backend_done.set_value(std::move(r)); });
    if (options.with_target) target_down = target->async_shutdown(asio::use_future);
  };
  switch (order) {
    case Order::same_tick:
      asio::post(io, [&] {
        registry_shutdown();
        backend_shutdown();
      });
      io.run();
      break;
    case Order::backend_first:
      backend_shutdown();
      registry_shutdown();
      break;
    case Order::registry_first:
      registry_shutdown();
      backend_shutdown();
      break;
    case Order::backend_then_registry:
      backend_shutdown();
      backend_future.wait();
      registry_shutdown();
      break;
    case Order::registry_then_backend:
      registry_shutdown();
      registry_future.wait();
      backend_shutdown();
      break;
  }
  if (registry_future.wait_for(15s) != std::future_status::ready) fail_run("the registry's shutdown was never answered");
  if (auto r = registry_future.get(); !r) fail_run("registry shutdown: " + r.error().message());
  if (backend_future.wait_for(15s) != std::future_status::ready) fail_run("the backend's shutdown was never answered");
  if (auto r = backend_future.get(); !r) fail_run("backend shutdown: " + r.error().message());
  if (!tally->wait_all(10s)) {
    fail_run("only " + std::to_string(tally->answered()) + " of " + std::to_string(tally->size()) + " callers answered");
  }
  kept.clear();
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (!events[i].is_set()) fail_run("region " + std::to_string(i) + " never latched deregistered");
  }
  const auto stats = registry.stats();
  if (stats.registered_bytes != 0 || stats.reserved_bytes != 0 || stats.regions != 0 ||
      stats.leaked_owned_buffers != 0) {
    fail_run("the registry still holds something");
  }
  if (initiator->live_registrations() != 0u) fail_run("the backend still holds registrations");
  tally->check();
  wait_value<void>(target->async_shutdown(asio::use_future), "target shutdown");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ORDER tcp|shm RUNS [--during-wire-up] [--with-target]\n", argv[0]);
    return corma::programs::exit_usage;
  }
  Options options;
  const auto order = order_named(argv[1]);
  const std::string transport = argv[2];
  const int runs = std::atoi(argv[3]);
  bool understood = order.has_value() && (transport == "tcp" || transport == "shm") && runs > 0;
  for (int i = 4; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--during-wire-up") {
      options.during_wire_up = true;
    } else if (flag == "--with-target") {
      options.with_target = true;
    } else {
      understood = false;
    }
  }
  if (!understood) {
    std::fprintf(stderr, "bad arguments\n");
    return corma::programs::exit_usage;
  }
  options.order = *order;
  options.tcp = transport == "tcp";
  int run = 0;
  corma::programs::Watchdog watchdog(std::chrono::seconds(20 + 10 * runs),
                                     [&] { return "run " + std::to_string(run) + " of " + std::to_string(runs); });
  for (; run < runs; ++run) one_run(options);
  std::printf("OK %d runs\n", runs);
  return 0;
}
