// A consumer's connection to one owner, shaped like the owner's side of it:
// one reader coroutine reads every frame and hands each answer to the
// request waiting for it (by request id), one writer at a time sends the
// requests in the order they were made, and any number of fetches talk on
// the connection at once. Nobody but the reader reads the socket, so a
// fetch that stops waiting (cancelled, or done) never leaves the connection
// out of step: an answer nobody waits for any more is dropped.
#pragma once

#include "rendezvous/protocol/framed_connection.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>
#include <unordered_map>

namespace corma::rendezvous {

/// An owner's `error` answer as the error it names.
[[nodiscard]] Error from_reply(const ErrorReply& reply);

class ConsumerLink : public std::enable_shared_from_this<ConsumerLink> {
 public:
  /// `io_timeout`: how long a request's answer, and a frame's write, may take.
  ConsumerLink(asio::ip::tcp::socket socket, std::chrono::milliseconds io_timeout);
  ConsumerLink(const ConsumerLink&) = delete;
  ConsumerLink& operator=(const ConsumerLink&) = delete;

  /// Starts the reader. `on_lost` runs once if the connection ends by any
  /// other way than close() (the owner closed it or died, a write or an
  /// answer timed out, the owner sent something malformed), after every
  /// request waiting has been answered with that error.
  void start(std::function<void(const Error&)> on_lost);

  /// Queues a request; its answer is kept for answer(id). Requests are
  /// written in the order they were queued, each to its end.
  ///
  /// A pull may name `landing`, where its answer's bytes belong at
  /// `landing_offset` of the object: a `data` answer of exactly that offset
  /// and length is read straight into it (the answer's Data::landed says
  /// so). The memory must stay valid until the answer is taken, or, after
  /// forget(id), until landings_settled() returns.
  std::uint64_t send(Message message, std::span<std::byte> landing = {}, std::uint64_t landing_offset = 0);
  /// The answer to request `id` (an owner's `error` as that error). Waits
  /// deaf to cancellation, so a request is never half done, and as long as
  /// the owner is alive: a slow answer (an acquire behind a large
  /// registration) is waited for while the owner sends anything, or answers
  /// the liveness probe (set_probe) sent half way through a silence; once
  /// the owner has been silent for io_timeout since the request was made,
  /// the connection is given up (`timeout`), so a caller is never stuck.
  /// Each id is answered once.
  asio::awaitable<Result<Message>> answer(std::uint64_t id);
  /// What to send to learn whether a silent owner is alive (a heartbeat on
  /// a version 4 session); its answer is dropped, only its coming counts.
  void set_probe(Message probe) { probe_ = std::move(probe); }
  /// send() then answer().
  asio::awaitable<Result<Message>> ask(Message message);
  /// Nobody will call answer(id): its answer is dropped when it comes.
  void forget(std::uint64_t id) { waiting_.erase(id); }
  /// Returns once no answer is being read into a landing (send()), so that
  /// the memory of forgotten requests may go. Deaf to cancellation: the
  /// read ends within the io timeout, or the connection does.
  asio::awaitable<void> landings_settled();
  /// Gives a `data` answer's bytes back for the next one (no allocation or
  /// page faults per chunk on a streamed fetch).
  void recycle(std::vector<std::byte> bytes);

  [[nodiscard]] bool is_open() const noexcept { return !ended_; }
  [[nodiscard]] const asio::any_io_executor& executor() const noexcept { return executor_; }
  /// Why the connection ended (empty while it is open, or after close()).
  [[nodiscard]] const std::optional<Error>& lost() const noexcept { return lost_; }
  /// Ends the connection on purpose: waiting requests are answered
  /// `peer_unreachable`, on_lost does not run.
  void close();
  /// Ends the connection because the owner broke the protocol: as if it
  /// were lost (on_lost runs).
  void give_up(Error why) { end(std::move(why), true); }

 private:
  struct Waiter {
    explicit Waiter(const asio::any_io_executor& ex) : wake(ex) {}
    std::optional<Result<Message>> answer;
    asio::steady_timer wake;  ///< cancelled when the answer comes
    std::span<std::byte> landing;
    std::uint64_t landing_offset = 0;
  };
  /// Where the payload of a `data` answer goes (FramedConnection::read):
  /// its waiter's landing, else a recycled buffer, else nowhere special.
  std::span<std::byte> land(const DataHead& head);

  asio::awaitable<void> read_loop(std::shared_ptr<ConsumerLink> self);  // `self` keeps it alive
  asio::awaitable<void> write_loop(std::shared_ptr<ConsumerLink> self);
  void enqueue(std::uint64_t id, Message message);
  /// Sends the probe unless one is on the wire already; false without one.
  bool probe_owner();
  /// The connection ended: every waiter is answered `why`.
  void end(Error why, bool lost);

  asio::any_io_executor executor_;
  FramedConnection connection_;
  std::chrono::milliseconds io_timeout_;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<Waiter>> waiting_;
  std::deque<Frame> to_write_;
  bool writing_ = false;
  bool ended_ = false;
  std::optional<Error> ended_why_;  ///< what requests made after the end are answered
  std::optional<Error> lost_;
  std::function<void(const Error&)> on_lost_;
  /// When the last frame came: a waiter that sees it move knows the owner is alive.
  asio::steady_timer::time_point last_frame_at_{};
  std::optional<Message> probe_;
  bool probe_on_the_wire_ = false;
  /// The answer being read into a waiter's landing now (land()), and the
  /// wake-up of landings_settled() (cancelled when that read ends).
  bool landing_now_ = false;
  asio::steady_timer landing_ended_;
  /// Buffers of answers taken, for the next answers; and the one the frame
  /// being read now fills.
  std::vector<std::vector<std::byte>> spare_buffers_;
  std::vector<std::byte> filling_;
  static constexpr std::size_t max_spare_buffers = 8;
};

}  // namespace corma::rendezvous
