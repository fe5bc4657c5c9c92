#include "rendezvous/consumer/consumer_link.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma::rendezvous {

namespace {

/// The reader waits this long between frames: the owner sends nothing
/// unasked, and each request has its own deadline.
constexpr std::chrono::hours no_deadline{24};

}  // namespace

Error from_reply(const ErrorReply& reply) {
  return Error{std::error_code(reply.code, error_category()), "owner: " + reply.detail};
}

ConsumerLink::ConsumerLink(asio::ip::tcp::socket socket, std::chrono::milliseconds io_timeout)
    : executor_(socket.get_executor()),
      connection_(std::move(socket), default_max_frame_body),
      io_timeout_(io_timeout),
      landing_ended_(executor_, asio::steady_timer::time_point::max()) {
  // Chunks arrive frame after frame: their buffer is kept, not made per chunk.
  connection_.keep_read_buffer_up_to(default_max_frame_body);
}

void ConsumerLink::start(std::function<void(const Error&)> on_lost) {
  on_lost_ = std::move(on_lost);
  asio::co_spawn(executor_, read_loop(shared_from_this()), asio::detached);
}

std::uint64_t ConsumerLink::send(Message message, std::span<std::byte> landing, std::uint64_t landing_offset) {
  const auto id = next_id_++;
  auto waiter = std::make_shared<Waiter>(executor_);
  waiter->landing = landing;
  waiter->landing_offset = landing_offset;
  if (ended_) waiter->answer = *ended_why_;
  waiting_.emplace(id, std::move(waiter));
  if (!ended_) enqueue(id, std::move(message));
  return id;
}

void ConsumerLink::enqueue(std::uint64_t id, Message message) {
  to_write_.push_back(Frame{id, std::move(message)});
  if (writing_) return;  // the writer takes it in turn
  writing_ = true;
  asio::co_spawn(executor_, write_loop(shared_from_this()), asio::detached);
}

asio::awaitable<void> ConsumerLink::write_loop([[maybe_unused]] std::shared_ptr<ConsumerLink> self) {
  while (!to_write_.empty() && !ended_) {
    const auto frame = std::move(to_write_.front());
    to_write_.pop_front();
    if (auto written = co_await connection_.write(frame, io_timeout_); !written) {
      // A half-written frame cannot be taken back: the connection is done.
      end(std::move(written).error(), true);
    }
  }
  to_write_.clear();
  writing_ = false;
}

std::span<std::byte> ConsumerLink::land(const DataHead& head) {
  auto found = waiting_.find(head.request_id);
  if (found == waiting_.end()) return {};  // nobody waits: read and dropped
  const auto& waiter = *found->second;
  if (waiter.landing.size() == head.len && waiter.landing_offset == head.offset) {
    landing_now_ = true;
    return waiter.landing;
  }
  if (!spare_buffers_.empty()) {
    filling_ = std::move(spare_buffers_.back());
    spare_buffers_.pop_back();
  }
  filling_.resize(head.len);  // zero-fills only what a recycled buffer did not hold
  return filling_;
}

void ConsumerLink::recycle(std::vector<std::byte> bytes) {
  if (spare_buffers_.size() < max_spare_buffers && bytes.capacity() != 0) spare_buffers_.push_back(std::move(bytes));
}

asio::awaitable<void> ConsumerLink::landings_settled() {
  while (landing_now_) {
    (void)co_await landing_ended_.async_wait(
        asio::bind_cancellation_slot(asio::cancellation_slot(), asio::as_tuple(asio::use_awaitable)));
  }
}

asio::awaitable<void> ConsumerLink::read_loop([[maybe_unused]] std::shared_ptr<ConsumerLink> self) {
  const DataLanding landing = [this](const DataHead& head) { return land(head); };
  while (!ended_) {
    auto frame = co_await connection_.read(no_deadline, io_timeout_, &landing);
    if (landing_now_) {
      // The landing's memory is the caller's again, however the read ended.
      landing_now_ = false;
      landing_ended_.cancel();
    }
    auto filled = std::move(filling_);
    filling_ = {};
    if (ended_) break;  // closed meanwhile
    if (!frame) {
      end(std::move(frame).error(), true);
      break;
    }
    last_frame_at_ = asio::steady_timer::clock_type::now();
    probe_on_the_wire_ = false;  // whatever came, the owner is alive
    // A payload read into a recycled buffer is the answer's bytes.
    if (auto* data = std::get_if<Data>(&frame.value().message); data != nullptr && data->landed != 0 && !filled.empty()) {
      data->bytes = std::move(filled);
      data->landed = 0;
    } else {
      recycle(std::move(filled));
    }
    const auto id = frame.value().request_id;
    Result<Message> answer = std::move(frame.value().message);
    if (auto* error = std::get_if<ErrorReply>(&answer.value())) answer = from_reply(*error);
    // Request id 0 answers no request: the owner refuses the connection
    // itself (too many connections) before closing it.
    if (id == 0) {
      end(answer ? Error{errc::protocol, "owner sent an answer to no request"} : answer.error(), true);
      break;
    }
    auto found = waiting_.find(id);
    if (found == waiting_.end()) continue;  // nobody waits for it any more
    found->second->answer = std::move(answer);
    found->second->wake.cancel();
  }
}

asio::awaitable<Result<Message>> ConsumerLink::answer(std::uint64_t id) {
  auto found = waiting_.find(id);
  if (found == waiting_.end()) co_return fail(errc::protocol, "request " + std::to_string(id) + " is not waiting");
  const auto waiter = found->second;
  // Given up only once the owner has been silent for io_timeout: not
  // counting the time before this request was made, and never while the
  // owner answers anything (this answer may just be slow). Half way through
  // a silence, the probe asks whether it still lives.
  const auto asked_at = asio::steady_timer::clock_type::now();
  std::optional<asio::steady_timer::time_point> probed_silence;  // the silence a probe was sent in
  while (!waiter->answer) {
    const auto silent_since = std::max(asked_at, last_frame_at_);
    const bool probed = probed_silence == silent_since;
    const auto wait = probe_ && !probed ? io_timeout_ / 2 : io_timeout_;
    if (asio::steady_timer::clock_type::now() < silent_since + wait) {
      waiter->wake.expires_at(silent_since + wait);
      (void)co_await waiter->wake.async_wait(
          asio::bind_cancellation_slot(asio::cancellation_slot(), asio::as_tuple(asio::use_awaitable)));
      continue;  // woken by the answer, the end, or the deadline: look again
    }
    if (!probed && probe_owner()) {
      probed_silence = silent_since;
      continue;
    }
    end(Error{errc::timeout, probed ? "the owner answered neither a request nor a heartbeat within the io timeout"
                                    : "the owner did not answer within the io timeout"},
        true);
  }
  waiting_.erase(id);
  co_return std::move(*waiter->answer);
}

bool ConsumerLink::probe_owner() {
  if (!probe_ || ended_) return false;
  if (probe_on_the_wire_) return true;  // its answer counts for every waiter
  probe_on_the_wire_ = true;
  forget(send(*probe_));
  return true;
}

asio::awaitable<Result<Message>> ConsumerLink::ask(Message message) {
  const auto id = send(std::move(message));
  co_return co_await answer(id);
}

void ConsumerLink::close() { end(Error{errc::peer_unreachable, "the connection to the owner is closed"}, false); }

void ConsumerLink::end(Error why, bool lost) {
  if (ended_) return;
  ended_ = true;
  ended_why_ = why;
  connection_.close();
  for (auto& [id, waiter] : waiting_) {
    if (!waiter->answer) waiter->answer = why;
    waiter->wake.cancel();
  }
  if (!lost) return;
  lost_ = Error{errc::peer_unreachable, why.message()};
  if (auto notify = std::move(on_lost_)) notify(*lost_);
}

}  // namespace corma::rendezvous
