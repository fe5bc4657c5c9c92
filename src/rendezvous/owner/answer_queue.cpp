#include "rendezvous/owner/answer_queue.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma::rendezvous {

AnswerQueue::AnswerQueue(FramedConnection& connection, std::chrono::milliseconds write_timeout,
                         std::uint16_t version)
    : connection_(connection),
      timeout_(write_timeout),
      version_(version),
      changed_(connection.socket().get_executor()) {}

// The answers are named before the co_await: g++ 12 destroys temporaries
// inside co_await expressions twice.
asio::awaitable<void> AnswerQueue::answer(Frame frame) {
  fit_to_version(frame.message, version_);
  Answer answer{std::move(frame)};
  co_await enqueue(std::move(answer));
}

asio::awaitable<void> AnswerQueue::answer_data(std::uint64_t request_id, std::uint64_t offset,
                                               std::span<const std::byte> bytes,
                                               std::shared_ptr<const void> keepalive) {
  Answer answer{DataAnswer{request_id, offset, bytes, std::move(keepalive)}};
  co_await enqueue(std::move(answer));
}

asio::awaitable<void> AnswerQueue::enqueue(Answer answer) {
  queue_.push_back(std::move(answer));
  if (writing_) co_return;  // the writer takes it in turn
  // This caller becomes the writer until the queue is empty: answers that
  // became ready while it wrote go out behind its own, in order.
  writing_ = true;
  while (!queue_.empty()) {
    auto next = std::move(queue_.front());
    queue_.pop_front();
    if (!failed_ && !co_await write(next)) {
      failed_ = true;  // a half-written frame cannot be taken back
      connection_.close();
    }
    finished();
  }
  writing_ = false;
}

asio::awaitable<Result<void>> AnswerQueue::write(const Answer& answer) {
  try {
    if (const auto* data = std::get_if<DataAnswer>(&answer)) {
      co_return co_await connection_.write_data(data->request_id, data->offset, data->bytes, timeout_);
    }
    co_return co_await connection_.write(std::get<Frame>(answer), timeout_);
  } catch (const std::exception& e) {
    // An answer that cannot be encoded: the writer must still go on (and
    // every request end), so it is a failed write like any other.
    co_return fail(errc::protocol, std::string("cannot write an answer: ") + e.what());
  }
}

void AnswerQueue::finished() noexcept {
  --in_progress_;
  changed_.cancel();
}

void AnswerQueue::give_back(std::size_t units) noexcept {
  held_ -= units;
  changed_.cancel();
}

asio::awaitable<void> AnswerQueue::until_below(std::size_t limit, std::size_t units) {
  while (in_progress_ >= limit || held_ >= units) {
    changed_.expires_at(asio::steady_timer::time_point::max());
    (void)co_await changed_.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace corma::rendezvous
