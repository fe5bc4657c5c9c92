// The verbs backend's notifications over the software provider: the bytes
// on the wire (read and written by a hand-driven peer, tests/verbs/
// raw_peer.hpp), the credit window that keeps every SEND within the peer's
// posted receives, notifications waiting for an acknowledgement when the
// peer closes, breaks, passes its deadline or the backend shuts down, closed
// peers kept receive-only, and the receive queues' room in the CQ.
#include "verbs/backend_fixture.hpp"
#include "verbs/raw_peer.hpp"

#include "mailbox.hpp"
#include "wire.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>

namespace corma::verbs {
namespace {

using namespace std::chrono_literals;

bool failed_with(const Result<void>& r, errc code) { return !r && r.error().is(code); }

std::vector<std::byte> bytes_of(std::initializer_list<std::uint8_t> values) {
  std::vector<std::byte> out;
  for (auto v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

/// A notification record, byte for byte (docs/backends.md, "Notifications").
std::vector<std::byte> notify_record(std::uint8_t sequence, std::uint8_t tag) {
  return bytes_of({0x43, 0x56, 0x4e, 0x31, 0x01, sequence, 0, 0, 0, 0, 0, 0, 0, tag, 0, 0, 0, 0, 0, 0, 0});
}

/// An acknowledgement record, byte for byte.
std::vector<std::byte> ack_record(std::uint64_t sequence, wire::NotifyStatus status) {
  return wire::encode_message(wire::AckMessage{sequence, status});
}

/// The sequence number a notification the backend sent carries.
std::uint64_t sequence_of(const std::vector<std::byte>& message) {
  auto decoded = wire::decode_message(message);
  EXPECT_TRUE(decoded && std::holds_alternative<wire::NotifyMessage>(decoded.value()));
  return decoded ? std::get<wire::NotifyMessage>(decoded.value()).sequence : 0;
}

class VerbsNotifications : public VerbsBackend {
 protected:
  struct Names {
    PeerId at_initiator{};  // the initiator's name for the target
    PeerId at_target{};     // the target's name for the initiator
  };

  static Names connect_both(Backend& initiator, Backend& target) {
    auto offer = answered(initiator.async_peer_offer(asio::use_future)).value();
    auto reply = answered(target.async_peer_accept(offer.blob, asio::use_future)).value();
    answered(initiator.async_peer_complete(offer.peer, reply.blob, asio::use_future)).value();
    return {offer.peer, reply.peer};
  }

  /// `raw` as an initiator of `target`: the target's name for it.
  static PeerId accept_raw(RawPeer& raw, Backend& target) {
    auto reply = answered(target.async_peer_accept(raw.blob(), asio::use_future)).value();
    raw.connect(reply.blob);
    return reply.peer;
  }

  /// `initiator` connected to `raw` as its target: the initiator's name for it.
  static PeerId offer_to_raw(Backend& initiator, RawPeer& raw) {
    auto offer = answered(initiator.async_peer_offer(asio::use_future)).value();
    raw.connect(offer.blob);
    answered(initiator.async_peer_complete(offer.peer, raw.blob(), asio::use_future)).value();
    return offer.peer;
  }

  static Result<void> notify(Backend& backend, PeerId peer, std::uint64_t tag) {
    return answered(backend.async_notify(peer, tag, asio::use_future));
  }

  static Result<Notification> receive(Backend& backend) {
    return answered(backend.async_receive_notification(asio::use_future));
  }

  bool tracking(const Backend& backend, std::size_t n) {
    return fabric.wait_until([&] { return backend.transfers_in_flight() == n; }, 5s);
  }
};

// ---- the bytes on the wire --------------------------------------------------

TEST_F(VerbsNotifications, EveryByteAPeerSendsIsCheckedAndWhatIsNoRecordIsDroppedAndCounted) {
  auto b = make();
  RawPeer raw(fabric);
  const PeerId from = accept_raw(raw, *b);

  ASSERT_EQ(raw.send(notify_record(77, 5)), IBV_WC_SUCCESS);
  auto got = receive(*b);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got.value().peer, from);
  EXPECT_EQ(got.value().tag, 5u);
  auto ack = raw.receive();
  ASSERT_TRUE(ack);
  EXPECT_EQ(*ack, bytes_of({0x43, 0x56, 0x52, 0x31, 0x01, 77, 0, 0, 0, 0, 0, 0, 0, 0x00})) << "CVR1, queued";

  const auto valid = notify_record(1, 1);
  auto cut = valid;
  cut.pop_back();
  auto padded = valid;
  padded.push_back(std::byte{0});
  auto bad_magic = valid;
  bad_magic[2] = std::byte{0x4b};  // "CVK1"
  auto bad_version = valid;
  bad_version[4] = std::byte{2};
  auto bad_status = ack_record(1, wire::NotifyStatus::queued);
  bad_status.back() = std::byte{4};
  const std::vector<std::vector<std::byte>> malformed = {
      {}, cut, padded, bad_magic, bad_version, bad_status, std::vector<std::byte>(RawPeer::slot)};
  // Twice round: more than a receive queue's worth, so the receives these
  // took were given back.
  std::uint64_t dropped = 0;
  for (int round = 0; round < 2; ++round) {
    for (const auto& bytes : malformed) {
      ASSERT_EQ(raw.send(bytes), IBV_WC_SUCCESS);
      ++dropped;
    }
    // A record, but with immediate data; and a write with immediate, which
    // leaves an earlier record's bytes in the receive's buffer.
    ASSERT_EQ(raw.send(valid, IBV_WR_SEND_WITH_IMM, 9), IBV_WC_SUCCESS);
    ASSERT_EQ(raw.send({}, IBV_WR_RDMA_WRITE_WITH_IMM, 9), IBV_WC_SUCCESS);
    dropped += 2;
    // An acknowledgement of nothing this side sent: ignored, not counted.
    ASSERT_EQ(raw.send(ack_record(0x1234, wire::NotifyStatus::queued)), IBV_WC_SUCCESS);
  }
  ASSERT_TRUE(fabric.wait_until([&] { return b->refused_notifications() == dropped; }, 5s))
      << b->refused_notifications() << " of " << dropped;

  // The connection still works, and nothing was answered in between: the
  // next acknowledgement is this one's.
  ASSERT_EQ(raw.send(notify_record(78, 6)), IBV_WC_SUCCESS);
  got = receive(*b);
  ASSERT_TRUE(got);
  EXPECT_EQ(got.value().tag, 6u);
  ack = raw.receive();
  ASSERT_TRUE(ack);
  EXPECT_EQ(*ack, ack_record(78, wire::NotifyStatus::queued));
  EXPECT_EQ(b->refused_notifications(), dropped);
  // No RNR check here: this peer keeps to no credits, and on a loaded
  // machine it can outrun the reposting of receives (it retries then). The
  // credit tests below check that well-behaved peers never meet one.
}

// ---- credits ----------------------------------------------------------------

TEST_F(VerbsNotifications, BothSidesNotifyingAtOnceNeverSendPastThePeersReceives) {
  constexpr std::uint64_t n = 300;
  Config shallow;
  shallow.send_queue_depth = 4;
  auto a = make(shallow);
  auto b = make(shallow);
  const auto names = connect_both(*a, *b);
  std::vector<std::future<Result<void>>> from_a, from_b;
  for (std::uint64_t i = 0; i < n; ++i) {
    from_a.push_back(a->async_notify(names.at_initiator, i, asio::use_future));
    from_b.push_back(b->async_notify(names.at_target, 1000 + i, asio::use_future));
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    auto at_b = receive(*b);
    ASSERT_TRUE(at_b) << at_b.error().message();
    EXPECT_EQ(at_b.value().tag, i) << "out of order";
    EXPECT_EQ(at_b.value().peer, names.at_target);
    auto at_a = receive(*a);
    ASSERT_TRUE(at_a) << at_a.error().message();
    EXPECT_EQ(at_a.value().tag, 1000 + i) << "out of order";
    EXPECT_EQ(at_a.value().peer, names.at_initiator);
  }
  for (auto& f : from_a) EXPECT_TRUE(answered(std::move(f)));
  for (auto& f : from_b) EXPECT_TRUE(answered(std::move(f)));
  EXPECT_EQ(fabric.rnr_naks(), 0u) << "a SEND found no receive posted";
  EXPECT_LE(fabric.max_outstanding(), shallow.send_queue_depth);
}

TEST_F(VerbsNotifications, AtMostAWindowIsUnacknowledgedAndEachAnswerIsWhatTheTargetSaid) {
  constexpr std::uint64_t n = Mailbox::window + 4;
  auto a = make();
  RawPeer raw(fabric);
  const PeerId peer = offer_to_raw(*a, raw);
  std::vector<std::future<Result<void>>> sent;
  for (std::uint64_t i = 0; i < n; ++i) sent.push_back(a->async_notify(peer, i, asio::use_future));

  std::vector<std::uint64_t> sequences;
  for (std::uint64_t i = 0; i < Mailbox::window; ++i) {
    auto message = raw.receive();
    ASSERT_TRUE(message) << "notification " << i << " never came";
    auto decoded = wire::decode_message(*message);
    ASSERT_TRUE(decoded);
    EXPECT_EQ(std::get<wire::NotifyMessage>(decoded.value()).tag, i);
    sequences.push_back(std::get<wire::NotifyMessage>(decoded.value()).sequence);
  }
  EXPECT_EQ(fabric.work_requests_posted(), std::size_t{Mailbox::window}) << "more than a window unacknowledged";

  // Acknowledged in the order sent, with every status, and some nonsense.
  const wire::NotifyStatus statuses[] = {wire::NotifyStatus::queued, wire::NotifyStatus::queue_full,
                                         wire::NotifyStatus::not_accepted, wire::NotifyStatus::shutting_down};
  for (std::uint64_t i = 0; i < Mailbox::window; ++i) {
    ASSERT_EQ(raw.send(ack_record(sequences[i], statuses[i % 4])), IBV_WC_SUCCESS);
    ASSERT_EQ(raw.send(ack_record(sequences[i], wire::NotifyStatus::queued)), IBV_WC_SUCCESS);  // repeated
    ASSERT_EQ(raw.send(ack_record(sequences[i] + 1000, wire::NotifyStatus::queued)), IBV_WC_SUCCESS);  // forged
  }
  for (std::uint64_t i = 0; i < Mailbox::window; ++i) {
    auto r = answered(std::move(sent[i]));
    switch (statuses[i % 4]) {
      case wire::NotifyStatus::queued: EXPECT_TRUE(r) << i << ": " << r.error().message(); break;
      case wire::NotifyStatus::queue_full: EXPECT_TRUE(failed_with(r, errc::budget_exceeded)) << i; break;
      default: EXPECT_TRUE(failed_with(r, errc::peer_unreachable)) << i; break;
    }
  }
  // The window opened: the rest went.
  for (std::uint64_t i = Mailbox::window; i < n; ++i) {
    auto message = raw.receive();
    ASSERT_TRUE(message);
    ASSERT_EQ(raw.send(ack_record(sequence_of(*message), wire::NotifyStatus::queued)), IBV_WC_SUCCESS);
    EXPECT_TRUE(answered(std::move(sent[i])));
  }
  EXPECT_EQ(a->refused_notifications(), 0u) << "acknowledgements are not notifications";
}

// ---- a notification waiting for its acknowledgement -------------------------

TEST_F(VerbsNotifications, ANotificationNobodyAcknowledgesTimesOutAndBreaksThePeer) {
  Config quick;
  quick.operation_timeout = 200ms;
  auto a = make(quick);
  RawPeer raw(fabric);
  const PeerId peer = offer_to_raw(*a, raw);
  auto r = notify(*a, peer, 1);
  EXPECT_TRUE(failed_with(r, errc::timeout)) << (r ? "acknowledged" : r.error().message());
  EXPECT_TRUE(raw.receive()) << "it was sent";
  EXPECT_TRUE(failed_with(notify(*a, peer, 2), errc::peer_unreachable));
  EXPECT_TRUE(tracking(*a, 0));
}

TEST_F(VerbsNotifications, ClosingThePeerAnswersANotificationWaitingForItsAcknowledgement) {
  auto a = make();
  RawPeer raw(fabric);
  const PeerId peer = offer_to_raw(*a, raw);
  auto sent = a->async_notify(peer, 1, asio::use_future);
  auto message = raw.receive();
  ASSERT_TRUE(message);
  EXPECT_TRUE(answered(a->async_peer_close(peer, asio::use_future)));
  auto r = answered(std::move(sent));
  EXPECT_TRUE(failed_with(r, errc::peer_unreachable)) << (r ? "acknowledged" : r.error().message());
  // Its acknowledgement, late, finds nothing: a closed queue pair kept to
  // refuse notifications ignores it, or (the SEND's completion not yet seen
  // at the close) the queue pair is gone and the raw peer's QP fails.
  (void)raw.send(ack_record(sequence_of(*message), wire::NotifyStatus::queued));
  EXPECT_TRUE(tracking(*a, 0));
}

TEST_F(VerbsNotifications, ShutdownAnswersANotificationWaitingForItsAcknowledgement) {
  Config quick;
  quick.shutdown_timeout = 100ms;  // how long shutdown waits for it before failing it
  auto a = make(quick);
  RawPeer raw(fabric);
  const PeerId peer = offer_to_raw(*a, raw);
  auto sent = a->async_notify(peer, 1, asio::use_future);
  ASSERT_TRUE(raw.receive());
  EXPECT_TRUE(answered(a->async_shutdown(asio::use_future)));
  auto r = answered(std::move(sent));
  EXPECT_TRUE(failed_with(r, errc::shutting_down)) << (r ? "acknowledged" : r.error().message());
}

TEST_F(VerbsNotifications, ATerminalCancellationAnswersAtOnceAndTheLateAcknowledgementFreesTheWindow) {
  auto a = make();
  RawPeer raw(fabric);
  const PeerId peer = offer_to_raw(*a, raw);
  asio::cancellation_signal signal;
  auto sent = a->async_notify(peer, 1, asio::bind_cancellation_slot(signal.slot(), asio::use_future));
  auto message = raw.receive();
  ASSERT_TRUE(message);
  signal.emit(asio::cancellation_type::terminal);
  auto r = answered(std::move(sent));
  EXPECT_TRUE(failed_with(r, errc::cancelled)) << (r ? "acknowledged" : r.error().message());
  EXPECT_EQ(a->transfers_in_flight(), 1u) << "it still waits for its acknowledgement";
  ASSERT_EQ(raw.send(ack_record(sequence_of(*message), wire::NotifyStatus::queued)), IBV_WC_SUCCESS);
  EXPECT_TRUE(tracking(*a, 0));
  auto next = a->async_notify(peer, 2, asio::use_future);
  message = raw.receive();
  ASSERT_TRUE(message);
  ASSERT_EQ(raw.send(ack_record(sequence_of(*message), wire::NotifyStatus::queued)), IBV_WC_SUCCESS);
  EXPECT_TRUE(answered(std::move(next)));
}

TEST_F(VerbsNotifications, AQueuePairInErrorAnswersANotificationNotYetSent) {
  auto a = make();
  auto b = make();
  const auto names = connect_both(*a, *b);
  fabric.hold_work();
  auto sent = a->async_notify(names.at_initiator, 1, asio::use_future);
  ASSERT_TRUE(tracking(*a, 1));
  fabric.move_qps_to_error();
  auto r = answered(std::move(sent));
  EXPECT_TRUE(failed_with(r, errc::peer_unreachable)) << (r ? "acknowledged" : r.error().message());
  fabric.release_work();
}

// ---- closed peers -----------------------------------------------------------

TEST_F(VerbsNotifications, AClosedPeerIsKeptToRefuseAndCountButLosesRemoteAccess) {
  auto a = make();
  auto b = make();
  const auto names = connect_both(*a, *b);
  std::vector<std::byte> exported(4096, std::byte{7});
  std::vector<std::byte> source = pattern(4096, 3);
  const auto remote = map(*b, exported, Access::remote_read_write);
  const auto local = map(*a, source, Access::local);
  EXPECT_TRUE(answered(b->async_peer_close(names.at_target, asio::use_future)));
  EXPECT_EQ(fabric.live_qps(), 2u) << "the closed side's queue pair was not kept";

  EXPECT_TRUE(failed_with(notify(*a, names.at_initiator, 1), errc::peer_unreachable));
  EXPECT_EQ(b->refused_notifications(), 1u);

  auto put = answered(a->async_put(
      PutRequest{names.at_initiator, local.id, 0, address(exported), 4096, remote.packed_key}, asio::use_future));
  EXPECT_FALSE(put) << "a closed peer wrote into the target's memory";
  EXPECT_EQ(exported, std::vector<std::byte>(4096, std::byte{7}));
  EXPECT_TRUE(fabric.wait_until([&] { return fabric.live_qps() == 1; }, 5s))
      << "the closed queue pair stayed after the peer misbehaved";
}

TEST_F(VerbsNotifications, OnlySoManyClosedPeersAreKept) {
  constexpr std::size_t connections = 20;
  constexpr std::size_t kept = 16;
  auto a = make();
  auto b = make();
  std::vector<Names> names;
  for (std::size_t i = 0; i < connections; ++i) names.push_back(connect_both(*a, *b));
  for (const auto& n : names) EXPECT_TRUE(answered(b->async_peer_close(n.at_target, asio::use_future)));
  EXPECT_TRUE(fabric.wait_until([&] { return fabric.live_qps() == connections + kept; }, 5s)) << fabric.live_qps();
  // The newest are the ones kept.
  EXPECT_TRUE(failed_with(notify(*a, names.back().at_initiator, 1), errc::peer_unreachable));
  EXPECT_EQ(b->refused_notifications(), 1u);
}

// ---- room ---------------------------------------------------------------------

TEST_F(VerbsNotifications, PeersBeyondTheReceiveCompletionQueueAreRefused) {
  Config small;
  small.send_queue_depth = 8;
  small.completion_queue_depth = 2 * Mailbox::receive_depth;
  auto a = make();
  auto b = make(small);
  connect_both(*a, *b);
  connect_both(*a, *b);
  auto offer = answered(a->async_peer_offer(asio::use_future)).value();
  auto third = answered(b->async_peer_accept(offer.blob, asio::use_future));
  ASSERT_FALSE(third);
  EXPECT_TRUE(third.error().is(errc::budget_exceeded)) << third.error().message();
  EXPECT_TRUE(answered(a->async_peer_close(offer.peer, asio::use_future)));

  Config tiny;
  tiny.send_queue_depth = 4;
  tiny.completion_queue_depth = Mailbox::receive_depth - 1;
  auto refused = create_over(tiny, fabric.api());
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::not_configured)) << refused.error().message();
}

}  // namespace
}  // namespace corma::verbs
