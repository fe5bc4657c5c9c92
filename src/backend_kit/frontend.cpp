#include "backend_kit/frontend.hpp"

#include "backend_kit/handed_over_threads.hpp"

#include <future>

namespace corma::backend_kit {
namespace {

/// The refusal path of submit(): answered on the caller's thread, so
/// posted (through the progress thread where the handler has no executor).
template <class Op>
auto refuse_with(EngineCore& engine, const std::shared_ptr<Op>& op) {
  // Refusals run inside submit(), while the engine is certainly there.
  return [op, &engine](Error e) { op->completion.post(engine.progress_executor(), std::move(e)); };
}

template <class Op, class Handler>
std::shared_ptr<Op> make_op(Handler h) {
  auto op = std::make_shared<Op>();
  op->completion = decltype(op->completion)(std::move(h));
  return op;
}

}  // namespace

void initiate_map(EngineCore& engine, void* ptr, std::size_t len, Access access,
                  RdmaBackend::Handler<BackendRegion> h) {
  auto op = make_op<MapOp>(std::move(h));
  op->ptr = ptr;
  op->len = len;
  op->access = access;
  engine.watch_cancellation(op, detail::any_cancellation,
                            [&engine](const std::shared_ptr<MapOp>& o) { engine.cancel_map(o); });
  engine.submit([&engine, op] { engine.run_map(op); }, refuse_with(engine, op));
}

void initiate_unmap(EngineCore& engine, RegionId id, RdmaBackend::Handler<void> h) {
  auto op = make_op<VoidOp>(std::move(h));
  // Cancelling an unmap abandons the notification; the unmap proceeds.
  engine.watch_cancellation(op, detail::terminal_only,
                            [&engine](const std::shared_ptr<VoidOp>& o) { engine.cancel_unmap(o); });
  engine.submit([&engine, op, id] { engine.run_unmap(op, id); }, refuse_with(engine, op));
}

void initiate_import_key(EngineCore& engine, PeerId peer, PackedKey key, RdmaBackend::Handler<RemoteKeyId> h) {
  auto op = make_op<ValueOp<RemoteKeyId>>(std::move(h));
  op->peer = peer;
  op->blob = std::move(key);
  engine.submit([&engine, op] { engine.run_import_key(op); }, refuse_with(engine, op));
}

void initiate_release_key(EngineCore& engine, RemoteKeyId key, RdmaBackend::Handler<void> h) {
  auto op = make_op<VoidOp>(std::move(h));
  engine.submit([&engine, op, key] { engine.run_release_key(op, key); }, refuse_with(engine, op));
}

void initiate_peer_offer(EngineCore& engine, RdmaBackend::Handler<PeerOffer> h) {
  auto op = make_op<ValueOp<PeerOffer>>(std::move(h));
  engine.submit([&engine, op] { engine.run_peer_offer(op); }, refuse_with(engine, op));
}

void initiate_peer_accept(EngineCore& engine, std::vector<std::byte> offer, RdmaBackend::Handler<PeerAnswer> h) {
  auto op = make_op<ValueOp<PeerAnswer>>(std::move(h));
  op->blob = std::move(offer);
  engine.submit([&engine, op] { engine.run_peer_accept(op); }, refuse_with(engine, op));
}

void initiate_peer_complete(EngineCore& engine, PeerId peer, std::vector<std::byte> answer,
                            RdmaBackend::Handler<void> h) {
  auto op = make_op<ValueOp<void>>(std::move(h));
  op->blob = std::move(answer);
  op->peer = peer;
  engine.submit([&engine, op] { engine.run_peer_complete(op); }, refuse_with(engine, op));
}

void initiate_peer_close(EngineCore& engine, PeerId peer, RdmaBackend::Handler<void> h) {
  auto op = make_op<VoidOp>(std::move(h));
  engine.submit([&engine, op, peer] { engine.run_peer_close(op, peer); }, refuse_with(engine, op));
}

void initiate_receive_notification(EngineCore& engine, RdmaBackend::Handler<Notification> h) {
  auto receiver = make_op<EngineCore::Receiver>(std::move(h));
  // A cancelled receive takes nothing: every cancellation type is honoured.
  engine.watch_cancellation(receiver, detail::any_cancellation, [&engine](const std::shared_ptr<EngineCore::Receiver>& r) {
    engine.cancel_receive(r);
  });
  engine.submit([&engine, receiver] { engine.run_receive(receiver); }, refuse_with(engine, receiver));
}

void initiate_shutdown(EngineCore& engine, RdmaBackend::Handler<void> h) {
  auto op = make_op<VoidOp>(std::move(h));
  // New commands are refused at once; those queued before run first (a get
  // asked before the shutdown is posted to the provider and gets until the
  // deadline to finish), and any a racing thread queued after it are
  // answered shutting_down. Through the command queue, not the io_context:
  // a sleeping progress thread would run an io handler before the commands
  // that woke it.
  engine.submit_last([engine = engine.shared_from_this(), op] { engine->run_shutdown(op); });
}

Result<std::thread> start_progress_thread(const std::shared_ptr<EngineCore>& engine,
                                          std::function<Result<void>()> start) {
  std::promise<Result<void>> started;
  auto start_result = started.get_future();
  std::thread thread([engine = std::shared_ptr<EngineCore>(engine), &started, &start]() mutable {
    auto outcome = start();
    const bool ok = static_cast<bool>(outcome);
    started.set_value(std::move(outcome));
    if (ok) engine->loop();
    engine.reset();  // the provider's handles may go with this last reference
    progress_thread_ending();
  });
  auto outcome = start_result.get();
  if (!outcome) {
    thread.join();
    return std::move(outcome).error();
  }
  return thread;
}

void stop_progress_thread(const std::shared_ptr<EngineCore>& engine, std::thread& thread) {
  engine->stop_accepting();
  // Teardown runs on the progress thread, which owns every provider handle.
  asio::post(engine->io, [engine] {
    engine->run_shutdown({});
    engine->quit();
  });
  if (thread.get_id() == std::this_thread::get_id()) {
    hand_over_own_thread(thread);
  } else if (thread.joinable()) {
    thread.join();
  }
}

}  // namespace corma::backend_kit
