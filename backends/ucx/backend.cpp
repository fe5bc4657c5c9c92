// The UCX backend's public face: creation and what only UCX can answer. The
// seam's operations are detail::EngineBackend's.
#include "engine.hpp"

#include "backend_kit/frontend.hpp"

namespace corma::ucx {

Result<std::shared_ptr<Backend>> Backend::create(const Config& config) {
  if (config.transport == Transport::shared_memory && config.error_handling == ErrorHandling::peer) {
    return fail(errc::not_configured,
                "UCX drops shared-memory lanes with peer error handling: use ErrorHandling::none");
  }
  if (config.command_queue_capacity == 0) return fail(errc::not_configured, "command queue capacity is 0");
  // UCX reads NET_DEVICES as a list, and "all" as every device.
  if (config.tcp_interface.find(',') != std::string::npos || config.tcp_interface == "all") {
    return fail(errc::not_configured, "tcp_interface names one network device, not '" + config.tcp_interface + "'");
  }
  auto engine = std::make_shared<Engine>(config);
  CORMA_TRY(auto thread, backend_kit::start_progress_thread(engine, [&engine] { return engine->start(); }));
  return std::shared_ptr<Backend>(new Backend(std::move(engine), std::move(thread)));
}

Backend::Backend(std::shared_ptr<Engine> engine, std::thread progress_thread)
    : EngineBackend(engine, std::move(progress_thread)), engine_(std::move(engine)) {}

bool Backend::rma_enabled() const noexcept { return engine_->rma; }
const Config& Backend::config() const noexcept { return engine_->config; }

}  // namespace corma::ucx
