// Notifications over UCX: the initiator flushes its endpoint (so every put
// issued before is complete at the target), then sends an active message
// carrying the target's token and the tag; the target's worker queues it
// for a receiver if the token names a peer it accepted, and acknowledges
// with what became of it, which is what the sender is answered. Messages
// are recorded inside UCX's callbacks and handled after the worker's turn.
#include "engine.hpp"

namespace corma::ucx {

namespace {

constexpr unsigned notify_am_id = 1;
constexpr unsigned ack_am_id = 2;

Result<void> outcome_of(wire::NotifyStatus status) {
  switch (status) {
    case wire::NotifyStatus::queued: return success();
    case wire::NotifyStatus::queue_full:
      return fail(errc::budget_exceeded, "the target's notification queue is full: not delivered");
    case wire::NotifyStatus::not_accepted:
      return fail(errc::peer_unreachable, "the target does not accept notifications from this side");
    case wire::NotifyStatus::shutting_down: return fail(errc::peer_unreachable, "the target is shutting down");
  }
  return fail(errc::protocol, "unknown acknowledgement");
}

}  // namespace

Result<void> Backend::Engine::listen_for_notifications(ucp_worker_h worker) {
  const auto handler = [this, worker](unsigned id, ucp_am_recv_callback_t callback) {
    ucp_am_handler_param_t param{};
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    param.id = id;
    param.cb = callback;
    param.arg = this;
    return ucp_worker_set_am_recv_handler(worker, &param);
  };
  if (auto st = handler(notify_am_id, &Engine::on_notify_message); st != UCS_OK) {
    return ucs_error(errc::not_configured, "ucp_worker_set_am_recv_handler", st);
  }
  if (auto st = handler(ack_am_id, &Engine::on_ack_message); st != UCS_OK) {
    return ucs_error(errc::not_configured, "ucp_worker_set_am_recv_handler", st);
  }
  return success();
}

void Backend::Engine::run_notify(const std::shared_ptr<UcxTransferOp>& op) {
  auto peer = initiator_peer(*op);
  if (!peer) return answer(*op, std::move(peer).error());
  // The puts of this turn are flushed first; the endpoint flush behind them
  // completes after every put issued before, and only then is it sent.
  flush_puts();
  track(op);
  peer.value()->wire_up_started = true;
  op->stage = UcxTransferOp::Stage::flushing;
  auto param = callback_param(*op);
  issued(*op, ucp_ep_flush_nbx(peer.value()->ep, &param));
}

bool Backend::Engine::notification_answered(UcxTransferOp& op) {
  switch (op.stage) {
    case UcxTransferOp::Stage::flushing: {
      op.stage = UcxTransferOp::Stage::sending;
      auto peer = peers.find(op.request.peer);
      if (peer == peers.end() || peer->second.ep == nullptr) {
        finish_transfer(op.id, UCS_ERR_CANCELED);
        return false;
      }
      // Kept in the op until the send completes (the op outlives it).
      op.notify_header = wire::encode_notify({peer->second.notify_token, op.tag, op.id});
      auto param = callback_param(op);
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_AM_SEND_FLAG_REPLY;  // the target acknowledges through the endpoint UCX gives it
      issued(op, ucp_am_send_nbx(peer->second.ep, notify_am_id, op.notify_header.data(), op.notify_header.size(),
                                 nullptr, 0, &param));
      return false;
    }
    case UcxTransferOp::Stage::sending:
      op.stage = UcxTransferOp::Stage::sent;
      return op.ack.has_value();
    case UcxTransferOp::Stage::sent: return op.ack.has_value();
    case UcxTransferOp::Stage::none: break;
  }
  return true;
}

Result<void> Backend::Engine::acknowledged(const UcxTransferOp& op) {
  return outcome_of(static_cast<wire::NotifyStatus>(*op.ack));
}

ucs_status_t Backend::Engine::on_notify_message(void* arg, const void* header, std::size_t header_length,
                                                void* /*data*/, std::size_t length, const ucp_am_recv_param_t* param) {
  auto* engine = static_cast<Engine*>(arg);
  const auto* bytes = static_cast<const std::byte*>(header);
  auto decoded = wire::decode_notify(std::span<const std::byte>(bytes, header_length));
  const ucp_ep_h reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  if (!decoded || length != 0) {
    engine->note_refused_notification();  // not a notification corma sent: dropped
    return UCS_OK;
  }
  engine->arrived_notifications.push_back(ArrivedNotification{reply, decoded.value()});
  return UCS_OK;
}

ucs_status_t Backend::Engine::on_ack_message(void* arg, const void* header, std::size_t header_length,
                                             void* /*data*/, std::size_t /*length*/,
                                             const ucp_am_recv_param_t* /*param*/) {
  auto* engine = static_cast<Engine*>(arg);
  const auto* bytes = static_cast<const std::byte*>(header);
  if (auto ack = wire::decode_ack(std::span<const std::byte>(bytes, header_length))) {
    engine->arrived_acks.push_back(ack.value());
  }
  return UCS_OK;
}

void Backend::Engine::send_ack(ucp_ep_h reply, const wire::NotifyAck& ack) {
  auto bytes = wire::encode_ack(ack);
  ucp_request_param_t param{};
  ucs_status_ptr_t sent = ucp_am_send_nbx(reply, ack_am_id, bytes.data(), bytes.size(), nullptr, 0, &param);
  // Under way: its bytes stay until UCX is done with them.
  if (sent != nullptr && !UCS_PTR_IS_ERR(sent)) pending_acks.push_back(PendingAck{sent, std::move(bytes)});
}

std::size_t Backend::Engine::handle_notification_messages() {
  std::size_t handled = 0;
  while (!arrived_notifications.empty()) {
    auto arrived = std::move(arrived_notifications);
    arrived_notifications.clear();
    for (const auto& message : arrived) {
      ++handled;
      auto status = wire::NotifyStatus::not_accepted;
      if (auto sender = notify_tokens.find(message.header.token); sender == notify_tokens.end()) {
        note_refused_notification();
      } else if (auto queued = deliver_notification({sender->second, message.header.tag}); queued) {
        status = wire::NotifyStatus::queued;
      } else {
        status = queued.error().is(errc::budget_exceeded) ? wire::NotifyStatus::queue_full
                                                           : wire::NotifyStatus::shutting_down;
      }
      if (message.reply != nullptr) send_ack(message.reply, {message.header.sequence, static_cast<std::uint64_t>(status)});
    }
  }
  // Acknowledgements UCX has finished with let their bytes go.
  pending_acks.remove_if([](const PendingAck& ack) {
    if (ucp_request_check_status(ack.request) == UCS_INPROGRESS) return false;
    ucp_request_free(ack.request);
    return true;
  });
  while (!arrived_acks.empty()) {
    auto acks = std::move(arrived_acks);
    arrived_acks.clear();
    for (const auto& ack : acks) {
      ++handled;
      auto* op = find_transfer(ack.sequence);
      if (op == nullptr || op->kind != backend_kit::TransferKind::notify || op->ack) continue;
      op->ack = ack.status;
      if (op->stage == UcxTransferOp::Stage::sent) finish_transfer(op->id, UCS_OK);
    }
  }
  return handled;
}

}  // namespace corma::ucx
