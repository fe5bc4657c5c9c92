// The backend contract for notifications: a notification arrives after the
// puts issued before it (alone, or ending a batch of puts), a full queue is
// an error the sender sees, peers the target does not accept are refused
// and counted, and receivers are answered once through cancellation and
// shutdown.
#include "contract/backend_contract.hpp"
#include "contract/contract_helpers.hpp"

#include <random>

namespace corma::contract {
namespace {

Result<void> notify(RdmaBackend& backend, PeerId peer, std::uint64_t tag) {
  return call<void>([&](auto h) { backend.async_notify(peer, tag, std::move(h)); });
}

Result<Notification> receive(RdmaBackend& backend) {
  return call<Notification>([&](auto h) { backend.async_receive_notification(std::move(h)); });
}

/// Two connected backends, with both sides' names for each other.
struct Connected {
  Pair pair;
  PeerId target_side{};  ///< the target's name for the initiator
};

void connect_both(const ContractParam& param, Connected& c) {
  c.pair.initiator = param.make();
  c.pair.target = param.make();
  auto offer = call<PeerOffer>([&](auto h) { c.pair.initiator.backend->async_peer_offer(std::move(h)); });
  ASSERT_TRUE(offer) << describe(offer);
  auto answer =
      call<PeerAnswer>([&](auto h) { c.pair.target.backend->async_peer_accept(offer.value().blob, std::move(h)); });
  ASSERT_TRUE(answer) << describe(answer);
  auto completed = call<void>([&](auto h) {
    c.pair.initiator.backend->async_peer_complete(offer.value().peer, answer.value().blob, std::move(h));
  });
  ASSERT_TRUE(completed) << describe(completed);
  c.pair.peer = offer.value().peer;
  c.target_side = answer.value().peer;
}

}  // namespace

TEST_P(BackendContract, ANotificationsReceiverAlwaysFindsThePutsBeforeItInPlace) {
  constexpr int rounds = 40;
  constexpr std::size_t slot = 64 * KiB;
  Connected c;
  ASSERT_NO_FATAL_FAILURE(connect_both(GetParam(), c));
  auto& initiator = *c.pair.initiator.backend;
  auto& target = *c.pair.target.backend;
  auto remote_buffer = OwnedBuffer::allocate(slot * rounds);
  auto local_buffer = OwnedBuffer::allocate(slot * rounds);
  std::fill(remote_buffer.data(), remote_buffer.data() + remote_buffer.size(), std::byte{0});
  auto remote = map(target, remote_buffer.data(), remote_buffer.size(), Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);

  // Round r puts 1 to 3 pieces of random sizes into slot r, then notifies
  // r, all without waiting: only the notification's ordering keeps the
  // receiver from looking too early.
  std::mt19937 random(11);
  std::vector<std::size_t> lengths(rounds);
  std::vector<Answer<void>> sent(rounds);
  std::vector<Answer<void>> puts;
  puts.reserve(rounds * 3);
  {
    Initiating scope;
    for (int r = 0; r < rounds; ++r) {
      const std::size_t offset = static_cast<std::size_t>(r) * slot;
      lengths[r] = 8 + random() % (slot - 8);
      fill(local_buffer.data() + offset, lengths[r], 500 + r);
      const int pieces = 1 + static_cast<int>(random() % 3);
      std::size_t done = 0;
      for (int p = 0; p < pieces; ++p) {
        const std::size_t len = p + 1 == pieces ? lengths[r] - done : (lengths[r] - done) / 2;
        if (len == 0) continue;
        auto& answer = puts.emplace_back();
        initiator.async_put(PutRequest{c.pair.peer, local.value().id, offset + done,
                                       address(remote_buffer.data()) + offset + done, len, remote.value().packed_key},
                            answer.handler());
        done += len;
      }
      initiator.async_notify(c.pair.peer, static_cast<std::uint64_t>(r), sent[r].handler());
    }
  }
  for (int r = 0; r < rounds; ++r) {
    auto got = receive(target);
    ASSERT_TRUE(got) << describe(got);
    EXPECT_EQ(got.value().peer, c.target_side) << "named after the wrong peer";
    const auto tag = got.value().tag;
    ASSERT_LT(tag, std::uint64_t{rounds});
    const std::size_t offset = static_cast<std::size_t>(tag) * slot;
    EXPECT_TRUE(same_bytes(remote_buffer.data() + offset, local_buffer.data() + offset, lengths[tag]))
        << "notification " << tag << " arrived before its puts' bytes";
  }
  for (auto& s : sent) {
    auto r = s.wait();
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(*r) << describe(*r);
  }
  for (auto& p : puts) {
    auto r = p.wait();
    EXPECT_TRUE(r.has_value() && *r) << "a put: " << describe(r);
  }
  EXPECT_EQ(target.refused_notifications(), 0u);
}

TEST_P(BackendContract, ABatchOfPutsEndingInANotificationLandsBeforeIt) {
  constexpr int rounds = 12;
  constexpr std::size_t puts_per_batch = 64;
  constexpr std::size_t piece = 4 * KiB;
  constexpr std::size_t slot = puts_per_batch * piece;
  Connected c;
  ASSERT_NO_FATAL_FAILURE(connect_both(GetParam(), c));
  if (IsSkipped()) return;
  auto& initiator = *c.pair.initiator.backend;
  auto& target = *c.pair.target.backend;
  auto remote_buffer = OwnedBuffer::allocate(slot * rounds);
  auto local_buffer = OwnedBuffer::allocate(slot * rounds);
  std::fill(remote_buffer.data(), remote_buffer.data() + remote_buffer.size(), std::byte{0});
  fill(local_buffer.data(), local_buffer.size(), 77);
  auto remote = map(target, remote_buffer.data(), remote_buffer.size(), Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);

  // Every round's batch of 64 puts (random lengths within their pieces) and
  // its notification, submitted without waiting for any of them.
  std::mt19937 random(23);
  std::vector<std::vector<std::size_t>> lengths(rounds);
  std::vector<Answer<BatchOutcome>> batches(rounds);
  {
    Initiating scope;
    for (int r = 0; r < rounds; ++r) {
      TransferBatch batch;
      for (std::size_t i = 0; i < puts_per_batch; ++i) {
        const std::size_t offset = static_cast<std::size_t>(r) * slot + i * piece;
        lengths[r].push_back(1 + random() % piece);
        batch.push_back(PutRequest{c.pair.peer, local.value().id, offset, address(remote_buffer.data()) + offset,
                                   lengths[r].back(), remote.value().packed_key});
      }
      initiator.async_put_batch(std::move(batch), BatchNotification{c.pair.peer, static_cast<std::uint64_t>(r)},
                                batches[r].handler());
    }
  }
  for (int r = 0; r < rounds; ++r) {
    auto got = receive(target);
    ASSERT_TRUE(got) << describe(got);
    const auto tag = got.value().tag;
    ASSERT_LT(tag, std::uint64_t{rounds});
    for (std::size_t i = 0; i < puts_per_batch; ++i) {
      const std::size_t offset = static_cast<std::size_t>(tag) * slot + i * piece;
      ASSERT_TRUE(same_bytes(remote_buffer.data() + offset, local_buffer.data() + offset, lengths[tag][i]))
          << "batch " << tag << "'s notification arrived before its put " << i;
    }
  }
  for (auto& b : batches) {
    auto outcome = b.wait();
    ASSERT_TRUE(outcome.has_value() && *outcome) << describe(outcome);
    EXPECT_EQ(outcome->value().size, puts_per_batch + 1) << "the notification is the batch's last element";
    EXPECT_TRUE(outcome->value().all_succeeded());
  }
}

// A batch of no puts that ends in a notification: the notification alone,
// element 0 of a batch of one.
TEST_P(BackendContract, AnEmptyBatchEndingInANotificationSendsTheNotificationAlone) {
  Connected c;
  ASSERT_NO_FATAL_FAILURE(connect_both(GetParam(), c));
  if (IsSkipped()) return;
  auto& initiator = *c.pair.initiator.backend;
  auto& target = *c.pair.target.backend;
  Answer<BatchOutcome> sent;
  {
    Initiating scope;
    initiator.async_put_batch(TransferBatch{}, BatchNotification{c.pair.peer, 41}, sent.handler());
  }
  auto got = receive(target);
  ASSERT_TRUE(got) << describe(got);
  EXPECT_EQ(got.value().tag, 41u);
  const auto outcome = sent.wait();
  ASSERT_TRUE(outcome.has_value() && *outcome) << describe(outcome);
  EXPECT_EQ(outcome->value().size, 1u);
  EXPECT_TRUE(outcome->value().all_succeeded());
}

TEST_P(BackendContract, ABatchWhosePutToThePeerIsRefusedSendsNoNotification) {
  Connected c;
  ASSERT_NO_FATAL_FAILURE(connect_both(GetParam(), c));
  if (IsSkipped()) return;
  auto& initiator = *c.pair.initiator.backend;
  auto& target = *c.pair.target.backend;
  auto remote_buffer = OwnedBuffer::allocate(64 * KiB);
  auto local_buffer = OwnedBuffer::allocate(64 * KiB);
  auto remote = map(target, remote_buffer.data(), remote_buffer.size(), Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);
  const auto base = address(remote_buffer.data());
  TransferBatch batch{
      PutRequest{c.pair.peer, local.value().id, 0, base, 4 * KiB, remote.value().packed_key},
      // Past the end of the target's region: refused before it is issued.
      PutRequest{c.pair.peer, local.value().id, 0, base + 60 * KiB, 8 * KiB, remote.value().packed_key},
      PutRequest{c.pair.peer, local.value().id, 8 * KiB, base + 8 * KiB, 4 * KiB, remote.value().packed_key},
  };
  auto outcome = call<BatchOutcome>([&](auto h) {
    initiator.async_put_batch(std::move(batch), BatchNotification{c.pair.peer, 1}, std::move(h));
  });
  ASSERT_TRUE(outcome) << describe(outcome);
  EXPECT_EQ(outcome.value().size, 4u);
  ASSERT_EQ(outcome.value().failures.size(), 2u);
  EXPECT_EQ(outcome.value().failures[0].index, 1u);
  EXPECT_EQ(outcome.value().failures[1].index, 3u) << "the notification fails with the refused put";
  EXPECT_EQ(outcome.value().failures[1].error.code, outcome.value().failures[0].error.code);
  // The next notification is the first the target receives: the batch's never left.
  ASSERT_TRUE(notify(initiator, c.pair.peer, 2));
  auto got = receive(target);
  ASSERT_TRUE(got) << describe(got);
  EXPECT_EQ(got.value().tag, 2u);
}

TEST_P(BackendContract, AFullNotificationQueueIsAnErrorTheSenderSees) {
  constexpr std::size_t extra = 10;
  Connected c;
  ASSERT_NO_FATAL_FAILURE(connect_both(GetParam(), c));
  auto& initiator = *c.pair.initiator.backend;
  auto& target = *c.pair.target.backend;
  std::vector<Answer<void>> sent(notification_queue_capacity + extra);
  {
    Initiating scope;
    for (std::size_t i = 0; i < sent.size(); ++i) initiator.async_notify(c.pair.peer, i, sent[i].handler());
  }
  std::size_t queued = 0;
  std::size_t refused = 0;
  for (auto& s : sent) {
    auto r = s.wait();
    ASSERT_TRUE(r.has_value()) << "a notification was never answered";
    if (*r) {
      ++queued;
    } else {
      EXPECT_TRUE(failed_with(*r, errc::budget_exceeded)) << describe(*r);
      ++refused;
    }
  }
  EXPECT_EQ(queued, notification_queue_capacity);
  EXPECT_EQ(refused, extra);
  std::uint64_t last = 0;
  for (std::size_t i = 0; i < notification_queue_capacity; ++i) {
    auto got = receive(target);
    ASSERT_TRUE(got) << describe(got);
    if (i > 0) {
      EXPECT_GT(got.value().tag, last) << "received out of order";
    }
    last = got.value().tag;
  }
  // Room again.
  EXPECT_TRUE(notify(initiator, c.pair.peer, 99999));
  EXPECT_EQ(receive(target).value().tag, 99999u);
}

TEST_P(BackendContract, NotificationsFromAPeerTheTargetNoLongerAcceptsAreRefusedAndCounted) {
  Connected c;
  ASSERT_NO_FATAL_FAILURE(connect_both(GetParam(), c));
  auto& initiator = *c.pair.initiator.backend;
  auto& target = *c.pair.target.backend;
  ASSERT_TRUE(notify(initiator, c.pair.peer, 1));
  EXPECT_EQ(receive(target).value().tag, 1u);
  ASSERT_TRUE(call<void>([&](auto h) { target.async_peer_close(c.target_side, std::move(h)); }));

  auto refused = call<void>([&](auto h) { initiator.async_notify(c.pair.peer, 2, std::move(h)); },
                            GetParam().peer_failure_limit);
  EXPECT_TRUE(failed_with(refused, errc::peer_unreachable)) << describe(refused);
  EXPECT_EQ(target.refused_notifications(), 1u);
  // Nothing was queued: a receive waits (and is cancelled unanswered by a notification).
  asio::cancellation_signal signal;
  Answer<Notification> waiting;
  {
    Initiating scope;
    target.async_receive_notification(asio::bind_cancellation_slot(signal.slot(), waiting.handler()));
  }
  EXPECT_FALSE(waiting.wait(std::chrono::milliseconds(50)).has_value()) << "a refused notification was queued";
  signal.emit(asio::cancellation_type::total);
  auto cancelled = waiting.wait();
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_TRUE(failed_with(*cancelled, errc::cancelled)) << describe(*cancelled);
}

TEST_P(BackendContract, ACancelledReceiveTakesNothingAndShutdownAnswersTheWaiting) {
  Connected c;
  ASSERT_NO_FATAL_FAILURE(connect_both(GetParam(), c));
  auto& initiator = *c.pair.initiator.backend;
  auto& target = *c.pair.target.backend;
  for (auto type : all_cancellation_types) {
    asio::cancellation_signal signal;
    Answer<Notification> cancelled;
    {
      Initiating scope;
      target.async_receive_notification(asio::bind_cancellation_slot(signal.slot(), cancelled.handler()));
    }
    signal.emit(type);
    auto r = cancelled.wait();
    ASSERT_TRUE(r.has_value());
    // Either it was cancelled, or (never here: nothing was sent) it got one.
    EXPECT_TRUE(failed_with(*r, errc::cancelled)) << describe(*r);
  }
  // A receiver waiting before the notification is sent gets it.
  Answer<Notification> early;
  {
    Initiating scope;
    target.async_receive_notification(early.handler());
  }
  ASSERT_TRUE(notify(initiator, c.pair.peer, 7));
  auto got = early.wait();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(*got) << describe(*got);
  EXPECT_EQ(got->value().tag, 7u);

  Answer<Notification> at_shutdown;
  {
    Initiating scope;
    target.async_receive_notification(at_shutdown.handler());
  }
  ASSERT_TRUE(call<void>([&](auto h) { target.async_shutdown(std::move(h)); }));
  auto r = at_shutdown.wait();
  ASSERT_TRUE(r.has_value()) << "a waiting receiver was not answered at shutdown";
  EXPECT_TRUE(failed_with(*r, errc::shutting_down)) << describe(*r);
  EXPECT_TRUE(failed_with(receive(target), errc::shutting_down));
  auto to_gone = call<void>([&](auto h) { initiator.async_notify(c.pair.peer, 8, std::move(h)); },
                            GetParam().peer_failure_limit);
  EXPECT_TRUE(is_corma_error(to_gone)) << "a notification to a peer that shut down: " << describe(to_gone);
  EXPECT_EQ(at_shutdown.calls(), 1);
  EXPECT_EQ(early.calls(), 1);
}

}  // namespace corma::contract
