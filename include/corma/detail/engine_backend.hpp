// The common face of backends that own a provider on a progress thread (UCX,
// verbs): the seam's operations become commands for the engine, and
// destruction tears the provider down on that thread. No provider type here.
#pragma once

#include <corma/backend.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <thread>

namespace corma::detail {
class EngineBackend;
}

namespace corma::backend_kit {
class EngineCore;
/// The engine behind a backend, for corma's own backends and tests; its type
/// is private to them.
EngineCore& core_of(const detail::EngineBackend& backend) noexcept;
}  // namespace corma::backend_kit

namespace corma::detail {

class EngineBackend : public RdmaBackend {
 public:
  ~EngineBackend() override;

  [[nodiscard]] asio::any_io_executor progress_executor() const final;
  [[nodiscard]] std::optional<std::size_t> live_registrations() const final;
  [[nodiscard]] std::uint64_t refused_notifications() const final;
  /// Transfers posted to the provider and not yet finished (answered or not).
  [[nodiscard]] std::size_t transfers_in_flight() const;

 protected:
  EngineBackend(std::shared_ptr<backend_kit::EngineCore> core, std::thread progress_thread);

  void do_map(void* ptr, std::size_t len, Access access, Handler<BackendRegion> h) final;
  void do_unmap(RegionId id, Handler<void> h) final;
  void do_get(GetRequest request, Handler<void> h) final;
  void do_put(PutRequest request, Handler<void> h) final;
  void do_get_batch(TransferBatch batch, Handler<BatchOutcome> h) final;
  void do_put_batch(TransferBatch batch, std::optional<BatchNotification> notification,
                    Handler<BatchOutcome> h) final;
  void do_atomic(AtomicRequest request, Handler<std::uint64_t> h) final;
  void do_flush(PeerId peer, Handler<void> h) final;
  void do_notify(PeerId peer, std::uint64_t tag, Handler<void> h) final;
  void do_receive_notification(Handler<Notification> h) final;
  void do_import_key(PeerId peer, PackedKey packed_key, Handler<RemoteKeyId> h) final;
  void do_release_key(RemoteKeyId key, Handler<void> h) final;
  void do_peer_offer(Handler<PeerOffer> h) final;
  void do_peer_accept(std::vector<std::byte> offer, Handler<PeerAnswer> h) final;
  void do_peer_complete(PeerId peer, std::vector<std::byte> answer, Handler<void> h) final;
  void do_peer_close(PeerId peer, Handler<void> h) final;
  void do_shutdown(Handler<void> h) final;

 private:
  friend backend_kit::EngineCore& backend_kit::core_of(const EngineBackend& backend) noexcept;

  std::shared_ptr<backend_kit::EngineCore> core_;
  std::thread thread_;
};

}  // namespace corma::detail
