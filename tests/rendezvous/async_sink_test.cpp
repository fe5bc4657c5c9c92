// A streamed fetch into an asynchronous sink (AsyncChunkSink): the chunks
// are handed over in order and written while the consumer's loop reads the
// next ones and serves other fetches; the sink holds at most two chunks at
// once; a fetch ends only once the sink answered for every chunk it was
// handed, also when it is cancelled; a sink's error ends the fetch with that
// error and its lease goes back; sink_on runs a plain sink on another
// executor's thread.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/thread_pool.hpp>

#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;
using Bytes = std::vector<std::byte>;

constexpr std::uint32_t chunk = 64 * 1024;

/// A sink that keeps what it is handed and answers only when the test says.
struct HeldSink {
  struct Held {
    std::uint64_t offset;
    std::span<const std::byte> bytes;
    corma::ChunkWritten done;
  };
  // A deque: its elements are never move-assigned, which Boost 1.81's
  // any_completion_handler (ChunkWritten) cannot be.
  std::deque<Held> held;
  std::size_t most_held = 0;
  Bytes written;
  bool in_order = true;

  corma::AsyncChunkSink sink() {
    return [this](std::uint64_t offset, std::span<const std::byte> bytes, corma::ChunkWritten done) {
      held.push_back(Held{offset, bytes, std::move(done)});
      most_held = std::max(most_held, held.size());
    };
  }
  /// Writes the oldest chunk held and answers it with `result`.
  void answer_one(corma::Result<void> result = corma::success()) {
    auto oldest = std::move(held.front());
    held.pop_front();
    in_order = in_order && oldest.offset == written.size();
    written.insert(written.end(), oldest.bytes.begin(), oldest.bytes.end());
    std::move(oldest.done)(std::move(result));
  }
};

class AsyncSink : public Rendezvous {
 protected:
  void SetUp() override {
    corma::OwnerConfig config;
    config.rdma_threshold = 1ULL << 40;  // every object in chunks
    config.chunk_size = chunk;
    start_owner(64 << 20, config);
    consumer = corma::testing::run(io, connect(consumer_registry)).value();
  }
  void TearDown() override {
    consumer.reset();
    Rendezvous::TearDown();
  }

  /// Starts a fetch of `name` into `sink`; its outcome lands in `outcome`.
  void start_fetch(const std::string& name, corma::AsyncChunkSink sink,
                   std::optional<corma::Result<corma::FetchOutcome>>& outcome,
                   asio::cancellation_slot cancel = {}) {
    corma::StreamDestination destination;
    destination.async_sink = std::move(sink);
    consumer->async_fetch_to(name, std::move(destination),
                             asio::bind_cancellation_slot(cancel, [&outcome](corma::Result<corma::FetchOutcome> r) {
                               outcome = std::move(r);
                             }));
  }

  void run_until(const std::function<bool()>& done) {
    corma::testing::run(io, until(done, std::chrono::seconds(10)));
    ASSERT_TRUE(done()) << "not reached within 10 s";
  }

  std::unique_ptr<corma::Consumer> consumer;
};

TEST_F(AsyncSink, TheLoopServesOtherFetchesWhileTheSinkHoldsChunksAndTheBytesArriveWhole) {
  HeldSink sink;
  std::optional<corma::Result<corma::FetchOutcome>> outcome;
  start_fetch("big", sink.sink(), outcome);
  run_until([&] { return sink.held.size() == 2; });

  // Nothing is written yet, and another fetch on the same connection is
  // served meanwhile.
  auto other = corma::testing::run(io, consumer->async_fetch("small"));
  ASSERT_TRUE(other) << other.error().message();
  const auto got = other.value().data.bytes();
  EXPECT_TRUE(Bytes(got.begin(), got.end()) == small);
  EXPECT_EQ(sink.held.size(), 2U) << "the sink was handed more than two chunks at once";
  EXPECT_FALSE(outcome.has_value()) << "the fetch ended while its sink still held chunks";

  run_until([&] {
    while (!sink.held.empty()) sink.answer_one();
    return outcome.has_value();
  });
  ASSERT_TRUE(*outcome) << outcome->error().message();
  EXPECT_EQ(outcome->value().path, corma::Path::chunked);
  EXPECT_EQ(sink.most_held, 2U);
  EXPECT_TRUE(sink.in_order) << "chunks were handed over out of order";
  EXPECT_TRUE(sink.written == big) << "the sink was handed other bytes than the object's";
  run_until([&] { return owner->stats().live_leases == 0; });
}

TEST_F(AsyncSink, ACancelledFetchEndsOnlyOnceItsSinkAnsweredForEveryChunkAndLeavesNoLease) {
  HeldSink sink;
  std::optional<corma::Result<corma::FetchOutcome>> outcome;
  asio::cancellation_signal cancel;
  start_fetch("big", sink.sink(), outcome, cancel.slot());
  run_until([&] { return sink.held.size() == 2; });
  cancel.emit(asio::cancellation_type::terminal);
  // A whole round trip on the same connection later, the fetch still waits
  // for the sink: it holds the fetch's chunks.
  ASSERT_TRUE(corma::testing::run(io, consumer->async_fetch("small")));
  EXPECT_FALSE(outcome.has_value()) << "the fetch ended while its sink still held chunks";

  run_until([&] {
    while (!sink.held.empty()) sink.answer_one();
    return outcome.has_value();
  });
  ASSERT_FALSE(*outcome) << "a cancelled fetch succeeded";
  EXPECT_TRUE(outcome->error().is(errc::cancelled)) << outcome->error().message();
  EXPECT_LT(sink.written.size(), big.size());
  run_until([&] { return owner->stats().live_leases == 0; });
}

TEST_F(AsyncSink, ASinksErrorEndsTheFetchWithThatErrorAndTheConnectionServesOn) {
  HeldSink sink;
  std::optional<corma::Result<corma::FetchOutcome>> outcome;
  start_fetch("big", sink.sink(), outcome);
  run_until([&] { return sink.held.size() == 2; });
  sink.answer_one();
  sink.answer_one(corma::fail(errc::backend, "the disk is full"));
  run_until([&] {
    while (!sink.held.empty()) sink.answer_one();
    return outcome.has_value();
  });
  ASSERT_FALSE(*outcome) << "the fetch succeeded although its sink failed";
  EXPECT_TRUE(outcome->error().is(errc::backend)) << outcome->error().message();
  EXPECT_NE(outcome->error().message().find("the disk is full"), std::string::npos) << outcome->error().message();
  run_until([&] { return owner->stats().live_leases == 0; });
  auto next = corma::testing::run(io, consumer->async_fetch("big"));
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(next.value().data.size(), big.size());
}

TEST_F(AsyncSink, SinkOnWritesOnTheThreadOfTheExecutorItIsGiven) {
  asio::thread_pool writer(1);
  std::mutex mutex;
  Bytes written(big.size());
  std::set<std::thread::id> threads;
  auto sink = corma::sink_on(writer.get_executor(),
                             [&](std::uint64_t offset, std::span<const std::byte> bytes) -> corma::Result<void> {
                               std::lock_guard lock(mutex);
                               threads.insert(std::this_thread::get_id());
                               std::copy(bytes.begin(), bytes.end(), written.begin() + static_cast<std::ptrdiff_t>(offset));
                               return corma::success();
                             });
  std::optional<corma::Result<corma::FetchOutcome>> outcome;
  start_fetch("big", std::move(sink), outcome);
  run_until([&] { return outcome.has_value(); });
  ASSERT_TRUE(*outcome) << outcome->error().message();
  std::lock_guard lock(mutex);
  EXPECT_TRUE(written == big);
  ASSERT_EQ(threads.size(), 1U);
  EXPECT_NE(*threads.begin(), std::this_thread::get_id()) << "the sink ran on the consumer's loop";
}

}  // namespace
