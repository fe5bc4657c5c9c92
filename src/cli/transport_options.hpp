// The backend choices the command line offers, and the backend they make.
#pragma once

#include <corma/ucx.hpp>

#include <string>

namespace corma::cli {

struct TransportOptions {
  std::string transport = "tcp";  ///< "tcp" or "shm"
  bool trusted_peers = false;
};

/// A UCX backend for the options: tcp with peer error handling, shared
/// memory with error handling none.
[[nodiscard]] Result<std::shared_ptr<ucx::Backend>> make_backend(const TransportOptions& options);

/// One line saying whether RDMA is on and why not.
[[nodiscard]] std::string describe(const TransportOptions& options, const ucx::Backend& backend);

}  // namespace corma::cli
