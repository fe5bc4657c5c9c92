// The verbs backend's public face: creation (loading libibverbs unless a
// table is given) and what only verbs can answer. The seam's operations are
// detail::EngineBackend's.
#include "engine.hpp"

#include "backend_kit/frontend.hpp"

namespace corma::verbs {

Result<std::shared_ptr<Backend>> Backend::create(const Config& config) {
  CORMA_TRY(auto api, load_libibverbs());
  return create(config, std::move(api));
}

Result<std::shared_ptr<Backend>> Backend::create(const Config& config, std::shared_ptr<const IbvApi> api) {
  if (!api) return fail(errc::not_configured, "verbs: no function table");
  if (config.command_queue_capacity == 0) return fail(errc::not_configured, "verbs: command queue capacity is 0");
  if (config.send_queue_depth == 0 || config.completion_queue_depth < config.send_queue_depth) {
    return fail(errc::not_configured,
                "verbs: the send queue depth must be at least 1 and at most the completion queue depth");
  }
  auto engine = std::make_shared<Engine>(config, std::move(api));
  CORMA_TRY(auto thread, backend_kit::start_progress_thread(engine, [&engine] { return engine->start(); }));
  return std::shared_ptr<Backend>(new Backend(std::move(engine), std::move(thread)));
}

Backend::Backend(std::shared_ptr<Engine> engine, std::thread progress_thread)
    : EngineBackend(engine, std::move(progress_thread)), engine_(std::move(engine)) {}

const std::string& Backend::device_name() const noexcept { return engine_->device.name; }
std::uint32_t Backend::max_message_size() const noexcept { return engine_->max_message; }
const Config& Backend::config() const noexcept { return engine_->config; }

}  // namespace corma::verbs
