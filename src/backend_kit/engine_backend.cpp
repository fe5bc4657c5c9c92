#include <corma/detail/engine_backend.hpp>

#include "backend_kit/frontend.hpp"

namespace corma::detail {

using namespace corma::backend_kit;

EngineBackend::EngineBackend(std::shared_ptr<EngineCore> core, std::thread progress_thread)
    : core_(std::move(core)), thread_(std::move(progress_thread)) {}

EngineBackend::~EngineBackend() { stop_progress_thread(core_, thread_); }

asio::any_io_executor EngineBackend::progress_executor() const { return core_->progress_executor(); }

std::optional<std::size_t> EngineBackend::live_registrations() const {
  return core_->live_registrations();
}
std::size_t EngineBackend::transfers_in_flight() const { return core_->transfers_in_flight(); }

void EngineBackend::do_map(void* ptr, std::size_t len, Access access, Handler<BackendRegion> h) {
  initiate_map(*core_, ptr, len, access, std::move(h));
}
void EngineBackend::do_unmap(RegionId id, Handler<void> h) { initiate_unmap(*core_, id, std::move(h)); }
void EngineBackend::do_get(GetRequest request, Handler<void> h) {
  core_->initiate_transfer(false, std::move(request), std::move(h));
}
void EngineBackend::do_put(PutRequest request, Handler<void> h) {
  core_->initiate_transfer(true, std::move(request), std::move(h));
}
void EngineBackend::do_get_batch(TransferBatch batch, Handler<BatchOutcome> h) {
  core_->initiate_batch(false, std::move(batch), std::nullopt, std::move(h));
}
void EngineBackend::do_put_batch(TransferBatch batch, std::optional<BatchNotification> notification,
                                 Handler<BatchOutcome> h) {
  core_->initiate_batch(true, std::move(batch), notification, std::move(h));
}
void EngineBackend::do_atomic(AtomicRequest request, Handler<std::uint64_t> h) {
  core_->initiate_atomic(std::move(request), std::move(h));
}
void EngineBackend::do_flush(PeerId peer, Handler<void> h) { core_->initiate_flush(peer, std::move(h)); }
void EngineBackend::do_notify(PeerId peer, std::uint64_t tag, Handler<void> h) {
  core_->initiate_notify(peer, tag, std::move(h));
}
void EngineBackend::do_receive_notification(Handler<Notification> h) {
  initiate_receive_notification(*core_, std::move(h));
}
std::uint64_t EngineBackend::refused_notifications() const { return core_->refused_notifications(); }
void EngineBackend::do_import_key(PeerId peer, PackedKey packed_key, Handler<RemoteKeyId> h) {
  initiate_import_key(*core_, peer, std::move(packed_key), std::move(h));
}
void EngineBackend::do_release_key(RemoteKeyId key, Handler<void> h) { initiate_release_key(*core_, key, std::move(h)); }
void EngineBackend::do_peer_offer(Handler<PeerOffer> h) { initiate_peer_offer(*core_, std::move(h)); }
void EngineBackend::do_peer_accept(std::vector<std::byte> offer, Handler<PeerAnswer> h) {
  initiate_peer_accept(*core_, std::move(offer), std::move(h));
}
void EngineBackend::do_peer_complete(PeerId peer, std::vector<std::byte> answer, Handler<void> h) {
  initiate_peer_complete(*core_, peer, std::move(answer), std::move(h));
}
void EngineBackend::do_peer_close(PeerId peer, Handler<void> h) { initiate_peer_close(*core_, peer, std::move(h)); }
void EngineBackend::do_shutdown(Handler<void> h) { initiate_shutdown(*core_, std::move(h)); }

}  // namespace corma::detail

namespace corma::backend_kit {

EngineCore& core_of(const detail::EngineBackend& backend) noexcept { return *backend.core_; }

}  // namespace corma::backend_kit
