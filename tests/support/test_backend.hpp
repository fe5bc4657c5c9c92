// TestBackend: a real, in-process implementation of the RdmaBackend seam for
// tests. "Peers" are other TestBackends (or the same one) in this process;
// transfers are memory copies checked against the target's live
// registrations, the way a NIC checks an rkey. Faults and delays can be
// injected. It is a test tool, not a product backend.
#pragma once

#include <corma/backend.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <thread>

namespace corma::testing {

struct TestBackendFaults {
  /// Between registering and answering a map: the window in which a
  /// cancellation finds the region already mapped and must roll it back.
  std::chrono::nanoseconds map_delay{0};
  /// Before a transfer's bytes move.
  std::chrono::nanoseconds transfer_delay{0};
  /// Unmap answers `shutting_down` without unmapping (an unconfirmed unmap).
  bool refuse_unmap = false;
  /// Transfers fail with `backend` (after transfer_delay).
  bool fail_transfers = false;
  /// Maps of memory starting in this range answer `backend`: memory the
  /// provider cannot register (a NIC that refuses to pin a file's mapping).
  std::span<const std::byte> refuse_maps_in{};
};

/// The test backend's descriptors and offers on the wire.
inline constexpr BackendId test_backend_id{3};

class TestBackend final : public RdmaBackend {
 public:
  static std::shared_ptr<TestBackend> create();
  ~TestBackend() override;

  [[nodiscard]] std::string_view key() const noexcept override { return "test"; }
  [[nodiscard]] BackendId wire_id() const noexcept override { return test_backend_id; }
  [[nodiscard]] asio::any_io_executor progress_executor() const override;
  [[nodiscard]] std::optional<std::size_t> live_registrations() const override;
  [[nodiscard]] std::uint64_t refused_notifications() const override;

  void set_faults(const TestBackendFaults& faults);

  /// Maps wait before reaching the "provider" until release_maps(): the
  /// deterministic "not yet run" window for cancellation tests.
  void hold_maps();
  void release_maps();

  /// Admitted transfers wait before moving bytes until release_transfers():
  /// the deterministic "in flight" window. async_shutdown() drains them like
  /// the provider backends do (up to 5 s), still holding their regions.
  void hold_transfers();
  void release_transfers();

  [[nodiscard]] std::size_t held_maps() const;
  [[nodiscard]] std::size_t transfers_in_flight() const;
  /// Peers offered, accepted or connected and not closed.
  [[nodiscard]] std::size_t open_peers() const;
  /// Remote keys imported (async_import_key) and not released, over every peer.
  [[nodiscard]] std::size_t imported_keys() const;
  /// Transfers whose caller was released by a cancellation (the transfer
  /// itself runs on), so far.
  [[nodiscard]] std::size_t transfers_cancelled() const;
  /// Map results handed to their handlers' executors so far.
  [[nodiscard]] std::size_t maps_handed_off() const;

  // Condition waits for tests (no sleeps): true when the condition held
  // within the timeout.
  bool wait_for_live(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  bool wait_for_held_maps(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  bool wait_for_transfers_in_flight(std::size_t n,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(5));
  bool wait_for_maps_handed_off(std::size_t n,
                                std::chrono::milliseconds timeout = std::chrono::seconds(5));

  struct State;

 protected:
  void do_map(void* ptr, std::size_t len, Access access, Handler<BackendRegion> h) override;
  void do_unmap(RegionId id, Handler<void> h) override;
  void do_get(GetRequest request, Handler<void> h) override;
  void do_put(PutRequest request, Handler<void> h) override;
  void do_get_batch(TransferBatch batch, Handler<BatchOutcome> h) override;
  void do_put_batch(TransferBatch batch, std::optional<BatchNotification> notification,
                    Handler<BatchOutcome> h) override;
  void do_atomic(AtomicRequest request, Handler<std::uint64_t> h) override;
  void do_flush(PeerId peer, Handler<void> h) override;
  void do_notify(PeerId peer, std::uint64_t tag, Handler<void> h) override;
  void do_receive_notification(Handler<Notification> h) override;
  void do_import_key(PeerId peer, PackedKey packed_key, Handler<RemoteKeyId> h) override;
  void do_release_key(RemoteKeyId key, Handler<void> h) override;
  void do_peer_offer(Handler<PeerOffer> h) override;
  void do_peer_accept(std::vector<std::byte> offer, Handler<PeerAnswer> h) override;
  void do_peer_complete(PeerId peer, std::vector<std::byte> answer, Handler<void> h) override;
  void do_peer_close(PeerId peer, Handler<void> h) override;
  void do_shutdown(Handler<void> h) override;

 private:
  TestBackend();
  void transfer(bool is_put, TransferRequest request, Handler<void> h);
  void transfer_batch(bool is_put, TransferBatch batch, std::optional<BatchNotification> notification,
                      Handler<BatchOutcome> h);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace corma::testing
