// Prometheus text metrics over HTTP (Boost.Beast): path and reason counters,
// registered bytes, budget, live leases, registration latency.
#pragma once

#include <corma/owner.hpp>
#include <corma/registry.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <string>

namespace corma::cli {

/// The metrics page for an owner and its registry (registry may be null).
[[nodiscard]] std::string render_metrics(const OwnerStats& owner, const RegistryStats* registry);

/// Serves GET /metrics on `acceptor` until it is closed.
boost::asio::awaitable<void> serve_metrics(boost::asio::ip::tcp::acceptor& acceptor, const Owner& owner,
                                           const Registry* registry);

}  // namespace corma::cli
