// Notifications over verbs: a SEND of a notification record, posted in the
// peer's backlog behind the puts issued before it; the target queues it (or
// refuses it) and SENDs back an acknowledgement naming it, which is what the
// sender is answered. Each queue pair keeps Mailbox::receive_depth receives
// posted, and each side keeps at most Mailbox::window notifications to a
// peer unacknowledged, so a SEND always finds a receive (mailbox.hpp).
//
// Why a SEND and not a zero-length RDMA WRITE with immediate: the immediate
// is 32 bits, and a notification carries a 64-bit tag and the sequence
// number its acknowledgement names. Either would be ordered the same way: an
// RC queue pair executes its requests in order, and the target's receive
// completes only once the message is placed, after every earlier RDMA
// WRITE's bytes. So no flush is needed before the SEND.
#include "engine.hpp"

#include <cstring>
#include <string>
#include <utility>

namespace corma::verbs {
namespace {

using backend_kit::answer;
using backend_kit::TransferKind;

/// What the sender of a notification the target did not queue is answered.
Error refusal(wire::NotifyStatus status) {
  switch (status) {
    case wire::NotifyStatus::queue_full:
      return Error{errc::budget_exceeded, "verbs: the target's notification queue is full: not delivered"};
    case wire::NotifyStatus::not_accepted:
      return Error{errc::peer_unreachable, "verbs: the target does not accept notifications from this side"};
    case wire::NotifyStatus::shutting_down:
      return Error{errc::peer_unreachable, "verbs: the target is shutting down"};
    case wire::NotifyStatus::queued:
      break;
  }
  return Error{errc::protocol, "verbs: a queued notification is no refusal"};
}

/// The record a completed receive brought, if it is one: only a SEND
/// without immediate data carries one (a write with immediate leaves the
/// slot's old bytes, which are not read at all), of exactly a record's size.
Result<wire::Message> message_in(const Mailbox& mailbox, const ibv_wc& wc) {
  if (wc.opcode != IBV_WC_RECV || (wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
    return fail(errc::protocol, "not a SEND without immediate data");
  }
  const auto bytes = mailbox.received(slot_of(wc.wr_id), wc.byte_len);
  if (!bytes) return fail(errc::protocol, "longer than a receive slot");
  return wire::decode_message(*bytes);
}

}  // namespace

// ---- the sender's side ----

void Backend::Engine::run_notify(const std::shared_ptr<VerbsTransferOp>& op) {
  if (auto wanted = still_wanted(*op); !wanted) return answer(*op, std::move(wanted).error());
  if (auto usable = usable_peer(op->request.peer); !usable) return answer(*op, std::move(usable).error());
  op->plan = ChunkPlan(0, max_message);  // one work request
  track(op);
  // Behind the puts admitted before it, unnumbered: flushes wait for puts,
  // not for notifications, and a refused notification fails no flush.
  push_backlog(op, peers.at(op->request.peer));
}

void Backend::Engine::prepare_notification(Peer& peer, VerbsTransferOp& op, ibv_send_wr& wr, ibv_sge& sge) {
  op.send_slot = peer.mailbox.take_notify_slot();
  op.in_window = true;
  ++peer.notifications_in_flight;
  // The transfer id names it in the acknowledgement: the table never gives
  // a live id twice, so an acknowledgement finds it or nothing.
  sge = peer.mailbox.fill(op.send_slot, wire::encode_message(wire::NotifyMessage{op.id, op.tag}));
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
}

void Backend::Engine::on_ack(PeerId from, const wire::AckMessage& ack) {
  auto* op = find_transfer(ack.sequence);
  // Only the acknowledgement of a notification posted to that very peer
  // counts; a stale, repeated or forged one is ignored.
  if (op == nullptr || op->kind != TransferKind::notify || op->request.peer != from || !op->in_window ||
      op->acknowledged) {
    return;
  }
  op->acknowledged = true;
  if (ack.status != wire::NotifyStatus::queued && !op->failure) op->failure = refusal(ack.status);
  finish_if_done(*op);
}

void Backend::Engine::notification_sent(VerbsTransferOp& op, const Peer* peer) {
  // Only a healthy connection brings an acknowledgement: one that broke or
  // closed after the SEND was posted (stop_sending passed it over, its SEND
  // not yet complete) sends none.
  if (op.acknowledged || op.failure || (peer != nullptr && !peer->broken && !peer->closed)) return;
  op.failure = closing() ? shut_down_error()
                         : Error{errc::peer_unreachable, "verbs: the peer broke or closed before acknowledging"};
}

void Backend::Engine::leave_window(const VerbsTransferOp& op) {
  auto peer = peers.find(op.request.peer);
  if (peer == peers.end()) return;
  --peer->second.notifications_in_flight;
  if (!peer->second.backlog.empty()) schedule_pump(peer->first, peer->second);
}

void Backend::Engine::fail_unacknowledged(Peer& peer, const Error& why) {
  if (peer.notifications_in_flight == 0) return;
  // Those whose SEND is still posted end with its completion (flushed, if
  // the peer broke); those already sent wait for nothing now.
  const auto waiting = transfers_where([&](const VerbsTransferOp& op) {
    return op.in_window && op.request.peer == peer.id && op.completed == op.plan.count();
  });
  for (auto id : waiting) {
    auto* op = find_transfer(id);
    if (!op->failure) op->failure = why;
    finish_if_done(*op);
  }
}

// ---- the target's side ----

void Backend::Engine::post_receive(Peer& peer, std::uint32_t slot) {
  if (peer.broken) return;  // it would only flush
  ibv_sge sge = peer.mailbox.receive_sge(slot);
  ibv_recv_wr wr{};
  wr.wr_id = slot_wr_id(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = api->post_recv(peer.qp.get(), &wr, &bad); rc != 0) {
    // A receive queue one short would, in time, turn a peer's SEND into an
    // RNR NAK: better to fail the connection now, saying why.
    return break_peer(peer, Error{errc::backend, std::string("verbs: ibv_post_recv: ") + std::strerror(rc)});
  }
  ++peer.receives_posted;
}

void Backend::Engine::on_receive(const ibv_wc& wc) {
  const auto known = peer_by_qp_num.find(wc.qp_num);
  if (known == peer_by_qp_num.end()) return;  // its queue pair is gone
  const PeerId peer_id = known->second;
  Peer& peer = peers.at(peer_id);
  --peer.receives_posted;
  const std::uint32_t slot = slot_of(wc.wr_id);
  // A broken peer's message is not taken: it could not be acknowledged, and
  // its sender is answered as its connection fails.
  if (wc.status == IBV_WC_SUCCESS && !peer.broken) {
    auto message = message_in(peer.mailbox, wc);
    if (!message) {
      note_refused_notification();  // dropped, and counted
      post_receive(peer, slot);
    } else if (const auto* notify = std::get_if<wire::NotifyMessage>(&message.value())) {
      // The receive is reposted once the acknowledgement is posted: until
      // then the sender's window holds the notification, so the credit
      // comes back before the sender may use it.
      peer.acks_due.push_back({{notify->sequence, accept_notification(peer, notify->tag)}, slot});
    } else {
      on_ack(peer_id, std::get<wire::AckMessage>(message.value()));
      post_receive(peer, slot);
    }
  }
  // Receives complete on a queue of their own, so a receive flushed by the
  // error state can be polled before the failed send that caused it. While
  // sends are posted, one of them completes with that cause (every send is
  // signalled), and the flushes behind a failed put must hear of it.
  const bool cause_follows = wc.status == IBV_WC_WR_FLUSH_ERR && peer.outstanding > 0;
  after_completion(wc, peer_id, &peer, cause_follows);
}

wire::NotifyStatus Backend::Engine::accept_notification(const Peer& peer, std::uint64_t tag) {
  if (peer.closed) {
    note_refused_notification();
    return wire::NotifyStatus::not_accepted;
  }
  auto queued = deliver_notification({peer.id, tag});
  if (queued) return wire::NotifyStatus::queued;
  return queued.error().is(errc::budget_exceeded) ? wire::NotifyStatus::queue_full
                                                   : wire::NotifyStatus::shutting_down;
}

void Backend::Engine::post_acks(Peer& peer) {
  while (!peer.acks_due.empty() && !peer.broken && send_room(peer) != 0) {
    const auto slot = peer.mailbox.take_ack_slot();
    if (!slot) return;  // an acknowledgement's completion frees one, and pumps
    const AckDue due = peer.acks_due.front();
    ibv_sge sge = peer.mailbox.fill(*slot, wire::encode_message(due.ack));
    ibv_send_wr wr{};
    wr.wr_id = slot_wr_id(*slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (int rc = api->post_send(peer.qp.get(), &wr, &bad); rc != 0) {
      peer.mailbox.give_back(*slot);
      return break_peer(peer, Error{errc::backend, std::string("verbs: ibv_post_send: ") + std::strerror(rc)});
    }
    peer.acks_due.pop_front();
    ++peer.outstanding;
    ++peer.acks_in_flight;
    ++outstanding_total;
    post_receive(peer, due.receive_slot);
  }
}

void Backend::Engine::on_ack_sent(Peer& peer, std::uint32_t slot) {
  --peer.acks_in_flight;
  peer.mailbox.give_back(slot);
}

}  // namespace corma::verbs
