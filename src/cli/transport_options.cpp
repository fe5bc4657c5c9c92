#include "transport_options.hpp"

#include "network_device.hpp"

#include <corma/ucx.hpp>

#ifdef CORMA_CLI_WITH_VERBS
#include <corma/verbs.hpp>
#endif

namespace corma::cli {
namespace {

Result<CommandBackend> make_ucx(const TransportOptions& options) {
  ucx::Config config;
  if (options.transport == "tcp") {
    config.transport = ucx::Transport::tcp;
    config.error_handling = ucx::ErrorHandling::peer;
  } else {
    config.transport = ucx::Transport::shared_memory;
    config.error_handling = ucx::ErrorHandling::none;
    config.operation_timeout = std::chrono::seconds(5);
  }
  config.trusted_peers = options.trusted_peers;
  const bool trusted_tcp = options.trusted_peers && options.transport == "tcp";
  if (trusted_tcp) {
    // Any peer that reaches UCX may read all of this process: only on the
    // interface the operator named by its address, never on every one.
    if (!options.local_address) return fail(errc::not_configured, "trusted tcp needs the address of one interface");
    CORMA_TRY(config.tcp_interface, device_holding(*options.local_address));
  }
  CORMA_TRY(auto backend, ucx::Backend::create(config));
  CommandBackend made{backend, backend->rma_enabled(), "transport " + options.transport};
  if (made.rma) {
    made.description += ", RDMA on";
    if (trusted_tcp) {
      made.description += " (trusted peers: any peer that reaches " + config.tcp_interface + " can read this process)";
    }
  } else {
    made.description += ", RDMA off (untrusted tcp: chunked path only; see --trusted-peers)";
  }
  return made;
}

Result<CommandBackend> make_verbs() {
#ifdef CORMA_CLI_WITH_VERBS
  CORMA_TRY(auto backend, verbs::Backend::create(verbs::Config{}));
  // The NIC checks every key, bounds and access flag: no trust setting needed.
  return CommandBackend{backend, true, "transport verbs on " + backend->device_name() + ", RDMA on"};
#else
  return fail(errc::not_configured, "this corma was built without the verbs backend");
#endif
}

}  // namespace

Result<CommandBackend> make_backend(const TransportOptions& options) {
  if (options.transport == "tcp" || options.transport == "shm") return make_ucx(options);
  if (options.transport == "verbs") return make_verbs();
  return fail(errc::not_configured, "unknown transport '" + options.transport + "' (tcp, shm or verbs)");
}

}  // namespace corma::cli
