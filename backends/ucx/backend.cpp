// The UCX backend's public face: creation, teardown, testing aids, and the
// seam's operations, which backend_kit's frontend turns into commands for
// the progress thread.
#include "engine.hpp"

#include "backend_kit/frontend.hpp"

namespace corma::ucx {

Result<std::shared_ptr<Backend>> Backend::create(const Config& config) {
  if (config.transport == Transport::shared_memory && config.error_handling == ErrorHandling::peer) {
    return fail(errc::not_configured,
                "UCX drops shared-memory lanes with peer error handling: use ErrorHandling::none");
  }
  if (config.command_queue_capacity == 0) return fail(errc::not_configured, "command queue capacity is 0");
  auto engine = std::make_shared<Engine>(config);
  CORMA_TRY(auto thread, backend_kit::start_progress_thread(engine, [&engine] { return engine->start(); }));
  std::shared_ptr<Backend> backend(new Backend(std::move(engine)));
  backend->thread_ = std::move(thread);
  return backend;
}

Backend::Backend(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

Backend::~Backend() { backend_kit::stop_progress_thread(engine_, thread_); }

std::optional<std::size_t> Backend::live_registrations() const {
  return engine_->live.load(std::memory_order_acquire);
}

std::size_t Backend::transfers_in_flight() const { return engine_->in_flight.load(std::memory_order_acquire); }
bool Backend::rma_enabled() const noexcept { return engine_->rma; }
std::size_t Backend::maps_answered() const { return engine_->maps_answered.load(std::memory_order_acquire); }

void Backend::set_map_answer_delay(std::chrono::nanoseconds delay) {
  engine_->map_answer_delay_ns.store(delay.count(), std::memory_order_release);
}
const Config& Backend::config() const noexcept { return engine_->config; }

void Backend::do_map(void* ptr, std::size_t len, Access access, Handler<BackendRegion> h) {
  backend_kit::initiate_map(*engine_, ptr, len, access, std::move(h));
}
void Backend::do_unmap(RegionId id, Handler<void> h) { backend_kit::initiate_unmap(*engine_, id, std::move(h)); }
void Backend::do_get(GetRequest request, Handler<void> h) {
  backend_kit::initiate_transfer(*engine_, false, std::move(request), std::move(h));
}
void Backend::do_put(PutRequest request, Handler<void> h) {
  backend_kit::initiate_transfer(*engine_, true, std::move(request), std::move(h));
}
void Backend::do_peer_offer(Handler<PeerOffer> h) { backend_kit::initiate_peer_offer(*engine_, std::move(h)); }
void Backend::do_peer_accept(std::vector<std::byte> offer, Handler<PeerAnswer> h) {
  backend_kit::initiate_peer_accept(*engine_, std::move(offer), std::move(h));
}
void Backend::do_peer_complete(PeerId peer, std::vector<std::byte> answer, Handler<void> h) {
  backend_kit::initiate_peer_complete(*engine_, peer, std::move(answer), std::move(h));
}
void Backend::do_peer_close(PeerId peer, Handler<void> h) {
  backend_kit::initiate_peer_close(*engine_, peer, std::move(h));
}
void Backend::do_shutdown(Handler<void> h) { backend_kit::initiate_shutdown(*engine_, std::move(h)); }

}  // namespace corma::ucx
