// The UCX backend's public face: creation, teardown, and the initiating side
// of each operation (validation that needs no UCX, cancellation hooks,
// submission to the progress thread).
#include "engine.hpp"

#include <future>

namespace corma::ucx {

Result<std::shared_ptr<Backend>> Backend::create(const Config& config) {
  if (config.transport == Transport::shared_memory && config.error_handling == ErrorHandling::peer) {
    return fail(errc::not_configured,
                "UCX drops shared-memory lanes with peer error handling: use ErrorHandling::none");
  }
  if (config.command_queue_capacity == 0) return fail(errc::not_configured, "command queue capacity is 0");
  auto engine = std::make_shared<Engine>(config);
  std::promise<Result<void>> started;
  auto start_result = started.get_future();
  std::thread thread([engine, &started] {
    auto outcome = engine->start();
    const bool ok = static_cast<bool>(outcome);
    started.set_value(std::move(outcome));
    if (ok) engine->loop();
  });
  auto outcome = start_result.get();
  if (!outcome) {
    thread.join();
    return std::move(outcome).error();
  }
  std::shared_ptr<Backend> backend(new Backend(std::move(engine)));
  backend->thread_ = std::move(thread);
  return backend;
}

Backend::Backend(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

Backend::~Backend() {
  engine_->accepting.store(false, std::memory_order_release);
  // Teardown runs on the progress thread, which owns every UCX handle.
  asio::post(engine_->io, [engine = engine_] {
    engine->run_shutdown({});
    engine->quit();
  });
  // Dropped by a completion running on our own progress thread: that thread
  // finishes the teardown by itself.
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else if (thread_.joinable()) {
    thread_.join();
  }
}

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

namespace {

/// The refusal path of submit(): answered on the caller's thread, so posted.
template <class Op>
auto refuse_with(const std::shared_ptr<Op>& op) {
  return [op](Error e) { op->completion.post(std::move(e)); };
}

}  // namespace

void Backend::do_map(void* ptr, std::size_t len, Access access, Handler<BackendRegion> h) {
  auto op = std::make_shared<MapOp>();
  op->completion = Completion<void(Result<BackendRegion>)>(std::move(h));
  op->ptr = ptr;
  op->len = len;
  op->access = access;
  engine_->watch_cancellation(op, [](Engine& e, const std::shared_ptr<MapOp>& o) { e.cancel_map(o); });
  engine_->submit([op](Engine& e) { e.run_map(op); }, refuse_with(op));
}

void Backend::do_unmap(RegionId id, Handler<void> h) {
  auto op = std::make_shared<VoidOp>();
  op->completion = Completion<void(Result<void>)>(std::move(h));
  // Cancelling an unmap abandons the notification; the unmap proceeds.
  engine_->watch_cancellation(op, [](Engine& e, const std::shared_ptr<VoidOp>& o) { e.cancel_unmap(o); });
  engine_->submit([op, id](Engine& e) { e.run_unmap(op, id); }, refuse_with(op));
}

void Backend::do_get(GetRequest request, Handler<void> h) {
  auto op = std::make_shared<TransferOp>();
  op->completion = Completion<void(Result<void>)>(std::move(h));
  op->request = std::move(request);
  engine_->watch_cancellation(op, [](Engine& e, const std::shared_ptr<TransferOp>& o) { e.cancel_transfer(o); });
  engine_->submit([op](Engine& e) { e.run_transfer(op); }, refuse_with(op));
}

void Backend::do_put(PutRequest request, Handler<void> h) {
  auto op = std::make_shared<TransferOp>();
  op->completion = Completion<void(Result<void>)>(std::move(h));
  op->is_put = true;
  op->request = std::move(request);
  engine_->watch_cancellation(op, [](Engine& e, const std::shared_ptr<TransferOp>& o) { e.cancel_transfer(o); });
  engine_->submit([op](Engine& e) { e.run_transfer(op); }, refuse_with(op));
}

void Backend::do_peer_offer(Handler<PeerOffer> h) {
  auto op = std::make_shared<ValueOp<PeerOffer>>();
  op->completion = Completion<void(Result<PeerOffer>)>(std::move(h));
  engine_->submit([op](Engine& e) { e.run_peer_offer(op); }, refuse_with(op));
}

void Backend::do_peer_accept(std::vector<std::byte> offer, Handler<PeerAnswer> h) {
  auto op = std::make_shared<ValueOp<PeerAnswer>>();
  op->completion = Completion<void(Result<PeerAnswer>)>(std::move(h));
  op->blob = std::move(offer);
  engine_->submit([op](Engine& e) { e.run_peer_accept(op); }, refuse_with(op));
}

void Backend::do_peer_complete(PeerId peer, std::vector<std::byte> answer, Handler<void> h) {
  auto op = std::make_shared<ValueOp<void>>();
  op->completion = Completion<void(Result<void>)>(std::move(h));
  op->blob = std::move(answer);
  op->peer = peer;
  engine_->submit([op](Engine& e) { e.run_peer_complete(op); }, refuse_with(op));
}

void Backend::do_peer_close(PeerId peer, Handler<void> h) {
  auto op = std::make_shared<VoidOp>();
  op->completion = Completion<void(Result<void>)>(std::move(h));
  engine_->submit([op, peer](Engine& e) { e.run_peer_close(op, peer); }, refuse_with(op));
}

void Backend::do_shutdown(Handler<void> h) {
  auto op = std::make_shared<VoidOp>();
  op->completion = Completion<void(Result<void>)>(std::move(h));
  // Refuse new commands at once; those already queued run after this one
  // and are answered shutting_down.
  engine_->accepting.store(false, std::memory_order_release);
  asio::post(engine_->io, [engine = engine_, op] { engine->run_shutdown(op); });
}

}  // namespace corma::ucx
