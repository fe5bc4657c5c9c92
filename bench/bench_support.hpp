// Small helpers every scenario file of the benchmark uses.
#pragma once

#include <corma/error.hpp>
#include <corma/owner.hpp>
#include <corma/registry.hpp>
#include <corma/ucx.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <memory>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace corma::bench {

using clock_type = std::chrono::steady_clock;

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;

/// "8B", "64KiB", "256MiB": the sizes in row names.
inline std::string size_name(std::size_t size) {
  if (size >= MiB) return std::to_string(size / MiB) + "MiB";
  if (size >= KiB) return std::to_string(size / KiB) + "KiB";
  return std::to_string(size) + "B";
}

/// corma's UCX backend over `transport` ("tcp" or "shm"), trusting its
/// peers: the benchmark measures RMA itself.
inline ucx::Config corma_config(const std::string& transport) {
  ucx::Config config;
  config.transport = transport == "tcp" ? ucx::Transport::tcp : ucx::Transport::shared_memory;
  config.error_handling = transport == "tcp" ? ucx::ErrorHandling::peer : ucx::ErrorHandling::none;
  config.trusted_peers = true;
  return config;
}

/// A registry over a fresh UCX backend on `transport`, with a budget no
/// benchmark reaches (4 GiB).
inline std::shared_ptr<Registry> ucx_registry(const std::string& transport, const char* what) {
  auto backend = ucx::Backend::create(corma_config(transport));
  if (!backend) throw std::runtime_error(std::string(what) + ": " + backend.error().message());
  return std::make_shared<Registry>(std::move(backend).value(), RegistryConfig{1ULL << 32, 0});
}

/// Stops an owner served on `io` and closes its acceptor, from `io`'s own
/// thread (the owner is not thread-safe), before that thread is let go.
inline void stop_serving(boost::asio::io_context& io, Owner& owner, boost::asio::ip::tcp::acceptor& acceptor) {
  boost::asio::post(io, [&] {
    owner.stop();
    acceptor.close();
  });
}

/// The value, or an exception naming `what` (a benchmark has no error path).
template <class T>
T must(Result<T> r, const char* what) {
  if (!r) throw std::runtime_error(std::string(what) + ": " + r.error().message());
  return std::move(r).value();
}

}  // namespace corma::bench
