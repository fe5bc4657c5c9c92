// The answering side of a connection whose requests are worked on
// concurrently: answers go out one at a time, in the order they are ready,
// and the requests not answered yet are counted, so the reader can stop
// taking more (back-pressure) and the connection can wait for the last.
#pragma once

#include "rendezvous/protocol/framed_connection.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <deque>
#include <memory>
#include <span>
#include <variant>

namespace corma::rendezvous {

class AnswerQueue {
 public:
  /// Answers are written as a session of `version` reads them (fit_to_version).
  AnswerQueue(FramedConnection& connection, std::chrono::milliseconds write_timeout, std::uint16_t version);

  /// A request was taken: it is in progress until its answer is written
  /// (or given up, once a write has failed).
  void begin() noexcept { ++in_progress_; }

  /// Answers one request begun: written at once when no other answer is
  /// being written, else queued behind those (whoever is writing writes it
  /// in turn, so the caller does not wait for them).
  asio::awaitable<void> answer(Frame frame);
  /// The same for a `data` answer, written straight from `bytes`, which
  /// `keepalive` keeps valid until then.
  asio::awaitable<void> answer_data(std::uint64_t request_id, std::uint64_t offset,
                                    std::span<const std::byte> bytes, std::shared_ptr<const void> keepalive);

  /// A request in progress stands for `units` of work (a batch's names)
  /// until it gives them back: the reader holds back past a limit of those
  /// too, so what a connection has queued is bounded by what it costs.
  void hold(std::size_t units) noexcept { held_ += units; }
  void give_back(std::size_t units) noexcept;

  /// A request begun is given up unanswered: its connection is gone.
  void forgo() noexcept { finished(); }

  /// Returns once fewer than `limit` requests are in progress, and fewer
  /// than `units` units are held.
  asio::awaitable<void> until_below(std::size_t limit, std::size_t units = std::numeric_limits<std::size_t>::max());

  [[nodiscard]] std::size_t in_progress() const noexcept { return in_progress_; }
  /// A write failed: the connection is closed, and answers are dropped.
  [[nodiscard]] bool failed() const noexcept { return failed_; }

 private:
  struct DataAnswer {
    std::uint64_t request_id;
    std::uint64_t offset;
    std::span<const std::byte> bytes;
    std::shared_ptr<const void> keepalive;
  };
  using Answer = std::variant<Frame, DataAnswer>;

  asio::awaitable<void> enqueue(Answer answer);
  asio::awaitable<Result<void>> write(const Answer& answer);
  void finished() noexcept;

  FramedConnection& connection_;
  std::chrono::milliseconds timeout_;
  std::uint16_t version_;
  std::deque<Answer> queue_;
  bool writing_ = false;
  bool failed_ = false;
  std::size_t in_progress_ = 0;
  std::size_t held_ = 0;
  /// Cancelled whenever a request ends: wakes until_below().
  asio::steady_timer changed_;
};

}  // namespace corma::rendezvous
