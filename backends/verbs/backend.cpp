// The verbs backend's public face: creation (loading libibverbs, or over a
// given table) and what only verbs can answer. The seam's operations are
// detail::EngineBackend's.
#include "engine.hpp"
#include "provider_table.hpp"

#include "backend_kit/frontend.hpp"

namespace corma::verbs {

Result<std::shared_ptr<Backend>> Backend::create(const Config& config) {
  CORMA_TRY(auto api, load_libibverbs());
  return create_over(config, std::move(api));
}

Result<std::shared_ptr<Backend>> create_over(const Config& config, std::shared_ptr<const IbvApi> api) {
  if (!api) return fail(errc::not_configured, "verbs: no function table");
  if (config.command_queue_capacity == 0) return fail(errc::not_configured, "verbs: command queue capacity is 0");
  if (config.send_queue_depth == 0 || config.completion_queue_depth < config.send_queue_depth) {
    return fail(errc::not_configured,
                "verbs: the send queue depth must be at least 1 and at most the completion queue depth");
  }
  if (config.completion_queue_depth < Mailbox::receive_depth) {
    return fail(errc::not_configured, "verbs: the completion queue depth must be at least " +
                                          std::to_string(Mailbox::receive_depth) + " (one peer's receive queue)");
  }
  return Backend::Engine::start_backend(config, std::move(api));
}

Result<std::shared_ptr<Backend>> Backend::Engine::start_backend(const Config& config,
                                                               std::shared_ptr<const IbvApi> api) {
  auto engine = std::make_shared<Engine>(config, std::move(api));
  CORMA_TRY(auto thread, backend_kit::start_progress_thread(engine, [&engine] { return engine->start(); }));
  // A nested class may use the backend's private constructor.
  return std::shared_ptr<Backend>(new Backend(std::move(engine), std::move(thread)));
}

Backend::Backend(std::shared_ptr<Engine> engine, std::thread progress_thread)
    : EngineBackend(engine, std::move(progress_thread)), engine_(std::move(engine)) {}

const std::string& Backend::device_name() const noexcept { return engine_->device.name; }
std::uint32_t Backend::max_message_size() const noexcept { return engine_->max_message; }
const Config& Backend::config() const noexcept { return engine_->config; }

}  // namespace corma::verbs
