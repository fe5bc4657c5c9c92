#include "rendezvous/consumer/sink.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma {

namespace asio = boost::asio;

AsyncChunkSink sink_on(asio::any_io_executor executor, ChunkSink write) {
  auto shared_write = std::make_shared<ChunkSink>(std::move(write));
  return [executor = std::move(executor), shared_write](std::uint64_t offset, std::span<const std::byte> bytes,
                                                        ChunkWritten done) {
    asio::post(executor, [shared_write, offset, bytes, done = std::move(done)]() mutable {
      std::move(done)((*shared_write)(offset, bytes));
    });
  };
}

namespace rendezvous {

namespace {

/// A sink's answer, from whatever thread gave it, taken back to `home`.
template <class Handler>
auto answered_at_home(const asio::any_io_executor& home, Handler handler) {
  return [home, handler = std::move(handler)](Result<void> written) mutable {
    asio::post(home, [handler = std::move(handler), written = std::move(written)]() mutable {
      std::move(handler)(std::move(written));
    });
  };
}

}  // namespace

Sink Sink::of(StreamDestination& destination, const asio::any_io_executor& home) {
  if (destination.async_sink) return Sink(std::move(destination.async_sink), home);
  return Sink(std::move(destination.sink));
}

asio::awaitable<Result<void>> Sink::write(std::uint64_t offset, std::span<const std::byte> bytes) const {
  if (!async_write_) co_return write_(offset, bytes);
  // The handler handed to the sink carries no cancellation slot: the fetch
  // waits for the sink's answer whatever happens to the fetch.
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(Result<void>)>(
      [this, offset, bytes](auto handler) { async_write_(offset, bytes, answered_at_home(home_, std::move(handler))); },
      asio::use_awaitable);
}

void Sink::hand_over(std::uint64_t offset, std::vector<std::byte> bytes, Taken taken) const {
  // The buffer moves into the answer's handler; the sink reads it through
  // a span that stays valid until that handler runs.
  auto kept = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  const std::span<const std::byte> view(*kept);
  async_write_(offset, view, answered_at_home(home_, [kept, taken = std::move(taken)](Result<void> written) {
                 taken(std::move(written), std::move(*kept));
               }));
}

struct HandedOver::Shared {
  explicit Shared(const asio::any_io_executor& home) : wake(home, asio::steady_timer::time_point::max()) {}
  std::size_t out = 0;
  std::vector<std::pair<std::size_t, Error>> failed;
  /// Cancelled at each answer; the one waiter checks `out` before it waits
  /// and on each wake-up, on the same executor, so no answer goes unseen.
  asio::steady_timer wake;
};

HandedOver::HandedOver(const asio::any_io_executor& home, std::size_t limit)
    : shared_(std::make_shared<Shared>(home)), limit_(limit == 0 ? 1 : limit) {}

void HandedOver::hand(const Sink& sink, std::size_t job, std::uint64_t offset, std::vector<std::byte> bytes,
                      std::function<void(std::vector<std::byte>)> recycle) {
  ++shared_->out;
  sink.hand_over(offset, std::move(bytes),
                 [shared = shared_, job, recycle = std::move(recycle)](Result<void> written,
                                                                       std::vector<std::byte> buffer) {
                   --shared->out;
                   if (!written) shared->failed.emplace_back(job, std::move(written).error());
                   if (recycle) recycle(std::move(buffer));
                   shared->wake.cancel();
                 });
}

asio::awaitable<void> HandedOver::until_out_below(std::size_t count) {
  while (shared_->out >= count) {
    (void)co_await shared_->wake.async_wait(
        asio::bind_cancellation_slot(asio::cancellation_slot(), asio::as_tuple(asio::use_awaitable)));
  }
}

asio::awaitable<void> HandedOver::room() { co_await until_out_below(limit_); }

asio::awaitable<void> HandedOver::all_back() { co_await until_out_below(1); }

std::vector<std::pair<std::size_t, Error>> HandedOver::failures() { return std::exchange(shared_->failed, {}); }

}  // namespace rendezvous
}  // namespace corma
