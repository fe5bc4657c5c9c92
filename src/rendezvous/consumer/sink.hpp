// Where a streamed fetch's bytes go: the caller's ChunkSink, called in
// place, or its AsyncChunkSink, handed the bytes and answering later from
// any thread. The fetch path speaks to both through `Sink`, and a pull loop
// keeps track of the chunks it handed over with `HandedOver`.
#pragma once

#include <corma/consumer.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace corma::rendezvous {

class Sink {
 public:
  Sink() = default;
  explicit Sink(ChunkSink write) : write_(std::move(write)) {}
  /// Answers come back to `home` (the consumer's executor).
  Sink(AsyncChunkSink write, boost::asio::any_io_executor home)
      : async_write_(std::move(write)), home_(std::move(home)) {}
  /// The caller's asynchronous sink when it gave one, else its plain one.
  static Sink of(StreamDestination& destination, const boost::asio::any_io_executor& home);

  explicit operator bool() const noexcept { return write_ || async_write_; }
  /// Whether chunks are handed over (hand_over) rather than written in place.
  [[nodiscard]] bool hands_over() const noexcept { return static_cast<bool>(async_write_); }

  /// Writes `bytes`, which the caller keeps valid, and waits until the sink
  /// is done with them: deaf to cancellation, since the sink may still be
  /// reading them.
  boost::asio::awaitable<Result<void>> write(std::uint64_t offset, std::span<const std::byte> bytes) const;

  /// Calls a sink that does not hand over (the caller's ChunkSink).
  [[nodiscard]] Result<void> write_in_place(std::uint64_t offset, std::span<const std::byte> bytes) const {
    return write_(offset, bytes);
  }

  /// The sink's verdict on a chunk handed over, with the chunk's buffer back.
  using Taken = std::function<void(Result<void>, std::vector<std::byte>)>;
  /// Hands `bytes` (kept alive until the sink answers) to an asynchronous
  /// sink; `taken` runs on the home executor, never inside this call.
  void hand_over(std::uint64_t offset, std::vector<std::byte> bytes, Taken taken) const;

 private:
  ChunkSink write_;
  AsyncChunkSink async_write_;
  boost::asio::any_io_executor home_;
};

/// Chunks an asynchronous sink holds at once, as AsyncChunkSink promises:
/// one written and one waiting keep a writer busy; more would only keep
/// more buffers away from the link's recycling.
inline constexpr std::size_t chunks_with_sink = 2;

/// The chunks one pull loop handed to asynchronous sinks and has not got
/// back: at most `limit` at once. Used from the home executor only, by one
/// waiting coroutine at a time.
class HandedOver {
 public:
  HandedOver(const boost::asio::any_io_executor& home, std::size_t limit);

  /// `bytes` of `job` handed to `sink`; their buffer goes to `recycle` once
  /// the sink answers, and a failure is kept for failures().
  void hand(const Sink& sink, std::size_t job, std::uint64_t offset, std::vector<std::byte> bytes,
            std::function<void(std::vector<std::byte>)> recycle);
  /// Waits until fewer than `limit` chunks are out.
  boost::asio::awaitable<void> room();
  /// Waits until every chunk is back. Both waits are deaf to cancellation:
  /// the sink holds the chunks, and the fetch ends only after it answered.
  boost::asio::awaitable<void> all_back();
  /// Jobs whose sink failed since the last call, with the sink's error.
  [[nodiscard]] std::vector<std::pair<std::size_t, Error>> failures();

 private:
  struct Shared;
  boost::asio::awaitable<void> until_out_below(std::size_t count);
  std::shared_ptr<Shared> shared_;  // also held by each chunk's answer, which may come after the loop
  std::size_t limit_;
};

}  // namespace corma::rendezvous
