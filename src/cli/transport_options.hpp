// The backend choices the command line offers, and the backend they make.
#pragma once

#include <corma/backend.hpp>
#include <corma/error.hpp>

#include <boost/asio/ip/address.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace corma::cli {

struct TransportOptions {
  std::string transport = "tcp";  ///< "tcp", "shm" (UCX) or "verbs" (the first RDMA device)
  bool trusted_peers = false;
  /// Trusted tcp: the local address peers reach this process on (serve: the
  /// one it listens on; get: the one it reaches the owner from). UCX then
  /// listens only on the network device holding it; trusted tcp without it
  /// is refused.
  std::optional<boost::asio::ip::address> local_address{};
};

/// The transports the command accepts, for its option checks.
[[nodiscard]] inline std::vector<std::string> transport_names() { return {"tcp", "shm", "verbs"}; }

struct CommandBackend {
  std::shared_ptr<RdmaBackend> backend;
  bool rma = false;         ///< whether it exposes memory for RDMA
  std::string description;  ///< one line: which transport, whether RDMA is on and why not
};

/// UCX over tcp (peer error handling) or shared memory (error handling none),
/// or raw verbs on the first device; `not_configured`, saying why, when the
/// transport cannot run here (or trusted tcp has no one interface to use).
[[nodiscard]] Result<CommandBackend> make_backend(const TransportOptions& options);

}  // namespace corma::cli
