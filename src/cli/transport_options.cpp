#include "transport_options.hpp"

namespace corma::cli {

Result<std::shared_ptr<ucx::Backend>> make_backend(const TransportOptions& options) {
  ucx::Config config;
  if (options.transport == "tcp") {
    config.transport = ucx::Transport::tcp;
    config.error_handling = ucx::ErrorHandling::peer;
  } else if (options.transport == "shm") {
    config.transport = ucx::Transport::shared_memory;
    config.error_handling = ucx::ErrorHandling::none;
    config.operation_timeout = std::chrono::seconds(5);
  } else {
    return fail(errc::not_configured, "unknown transport '" + options.transport + "' (tcp or shm)");
  }
  config.trusted_peers = options.trusted_peers;
  return ucx::Backend::create(config);
}

std::string describe(const TransportOptions& options, const ucx::Backend& backend) {
  if (backend.rma_enabled()) {
    return "transport " + options.transport + ", RDMA on" +
           (options.trusted_peers && options.transport == "tcp" ? " (trusted peers: any peer can read this process)" : "");
  }
  return "transport " + options.transport + ", RDMA off (untrusted tcp: chunked path only; see --trusted-peers)";
}

}  // namespace corma::cli
