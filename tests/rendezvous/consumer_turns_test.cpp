// The consumer's connection discipline: fetches take turns on one
// connection (only one fetch's requests on the wire at a time, whatever is
// cancelled; a fetch's own pulls are pipelined),
// and a dead owner is noticed within seconds even while an RDMA get waits.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>

#include <deque>
#include <optional>
#include <random>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;

/// An owner that answers every request in order after a short pause, and
/// sorts the requests that arrived while another was still unanswered: of
/// the same fetch (pulls of one lease, pipelined on purpose) or of another
/// (two fetches talking at once: never allowed).
struct StrictOwner {
  std::vector<std::byte> object = pattern(3000, 4);
  int overlapping = 0;
  int pipelined = 0;
  int requests = 0;

  struct Pending {
    rv::Frame frame;
    std::optional<std::uint64_t> lease;  // empty: a request that opens a fetch (acquire, hello)
  };
  std::deque<Pending> unanswered;
  bool closed = false;
  bool done = false;  // serve() returned: the owner may be destroyed

  static std::optional<std::uint64_t> lease_of(const rv::Message& message) {
    if (auto* pull = std::get_if<rv::Pull>(&message)) return pull->lease;
    if (auto* release = std::get_if<rv::Release>(&message)) return release->lease;
    return std::nullopt;
  }

  /// Records each request as it arrives.
  asio::awaitable<void> read_requests(rv::FramedConnection& connection, asio::steady_timer& arrived) {
    for (;;) {
      auto frame = co_await connection.read(std::chrono::seconds(5));
      if (!frame) break;
      ++requests;
      const auto lease = lease_of(frame.value().message);
      if (!unanswered.empty()) {
        const bool same_fetch = lease && unanswered.back().lease == lease;
        ++(same_fetch ? pipelined : overlapping);
      }
      unanswered.push_back(Pending{std::move(frame).value(), lease});
      arrived.cancel();
    }
    closed = true;
    arrived.cancel();
  }

  rv::Message answer(const rv::Message& message, std::uint64_t& next_lease) const {
    if (std::holds_alternative<rv::Hello>(message)) return rv::HelloOk{};
    if (std::holds_alternative<rv::Acquire>(message)) {
      return rv::Chunked{next_lease++, object.size(), 1000, 10000, rv::ChunkedReason::no_offer};
    }
    if (auto* pull = std::get_if<rv::Pull>(&message)) {
      const auto first = object.begin() + static_cast<std::ptrdiff_t>(pull->offset);
      return rv::Data{pull->offset, std::vector<std::byte>(first, first + static_cast<std::ptrdiff_t>(pull->len))};
    }
    return rv::Released{};
  }

  asio::awaitable<void> serve(asio::ip::tcp::acceptor& acceptor) {
    auto socket = co_await acceptor.async_accept(asio::use_awaitable);
    rv::FramedConnection connection(std::move(socket), rv::default_max_frame_body);
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer pause(executor);
    asio::steady_timer arrived(executor);
    asio::co_spawn(executor, read_requests(connection, arrived), asio::detached);
    std::uint64_t next_lease = 1;
    // Until the reader is done: it uses this frame's connection and timer.
    while (!closed || !unanswered.empty()) {
      if (unanswered.empty()) {
        arrived.expires_at(asio::steady_timer::time_point::max());
        co_await arrived.async_wait(asio::as_tuple(asio::use_awaitable));
        continue;
      }
      pause.expires_after(std::chrono::microseconds(300));
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      const auto& request = unanswered.front().frame;
      rv::Frame response{request.request_id, answer(request.message, next_lease)};
      const bool written = static_cast<bool>(co_await connection.write(response, std::chrono::seconds(5)));
      unanswered.pop_front();
      if (!written) {
        connection.close();
        unanswered.clear();
      }
    }
    done = true;
  }

  /// Runs `io` until serve() returned (the consumer closed its connection).
  void wait_until_done(asio::io_context& io) {
    io.restart();
    while (!done && io.run_one_for(std::chrono::seconds(5)) != 0) {
    }
  }
};

struct Tally {
  std::vector<int> answers;
  int answered = 0;
  int succeeded = 0;
  int cancelled = 0;
};

/// One fetch, counted when it is answered. (Parameters, not lambda
/// captures: a coroutine outlives the closure that started it.)
asio::awaitable<void> fetch_and_count(corma::Consumer& consumer, std::uint64_t expected_size, Tally& tally, int i) {
  auto r = co_await consumer.async_fetch("object");
  ++tally.answers[static_cast<std::size_t>(i)];
  ++tally.answered;
  if (r) {
    ++tally.succeeded;
    EXPECT_EQ(r.value().size, expected_size);
  } else if (r.error().is(errc::cancelled)) {
    ++tally.cancelled;
  } else {
    ADD_FAILURE() << "fetch " << i << ": " << r.error().message();
  }
}

TEST_F(Rendezvous, CancellingQueuedFetchesAtRandomNeverPutsTwoRequestsOnTheWire) {
  StrictOwner strict;
  asio::co_spawn(io, strict.serve(acceptor), asio::detached);
  constexpr int fetches = 60;
  Tally tally;
  tally.answers.assign(fetches, 0);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(nullptr)).value();
    std::vector<asio::cancellation_signal> signals(fetches);
    std::vector<std::unique_ptr<asio::steady_timer>> cancellers;
    std::mt19937 rng(7);
    for (int i = 0; i < fetches; ++i) {
      asio::co_spawn(io, fetch_and_count(*consumer, strict.object.size(), tally, i),
                     asio::bind_cancellation_slot(signals[static_cast<std::size_t>(i)].slot(), asio::detached));
      // Every other fetch is cancelled after a random short time, while it
      // most likely still waits for its turn.
      if (i % 2 == 1) {
        auto timer = std::make_unique<asio::steady_timer>(io, std::chrono::microseconds(rng() % 20000));
        // A timer destroyed at the end still calls its handler (aborted),
        // after `signals` is gone: only a timer that expired may touch it.
        timer->async_wait([&signals, i](boost::system::error_code ec) {
          if (ec) return;
          signals[static_cast<std::size_t>(i)].emit(asio::cancellation_type::terminal);
        });
        cancellers.push_back(std::move(timer));
      }
    }
    asio::steady_timer wait(io);
    while (tally.answered < fetches) {
      wait.expires_after(std::chrono::milliseconds(2));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }());
  strict.wait_until_done(io);
  ASSERT_TRUE(strict.done) << "the owner never saw the consumer go";
  for (int i = 0; i < fetches; ++i) EXPECT_EQ(tally.answers[static_cast<std::size_t>(i)], 1) << "fetch " << i;
  EXPECT_EQ(strict.overlapping, 0) << "of " << strict.requests << " requests";
  EXPECT_GT(strict.pipelined, 0) << "no fetch kept several pulls on the wire";
  EXPECT_GT(tally.cancelled, 0) << "no queued fetch was cancelled: the test did not test";
  EXPECT_EQ(tally.succeeded + tally.cancelled, fetches) << "a fetch failed otherwise";
}

asio::awaitable<void> fetch_into(corma::Consumer& consumer, std::optional<corma::Result<corma::Fetched>>& outcome) {
  outcome = co_await consumer.async_fetch("big");
}

TEST_F(Rendezvous, AFetchCancelledDuringItsRdmaGetStopsWithoutFallbackAndLeavesTheConnectionUsable) {
  start_owner();
  consumer_backend->hold_transfers();
  std::optional<corma::Result<corma::Fetched>> cancelled;
  std::optional<corma::Result<corma::Fetched>> next;
  std::size_t held_when_answered = 0;
  std::size_t registered_when_answered = 0;
  asio::cancellation_signal cancel;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    asio::co_spawn(io, fetch_into(*consumer, cancelled), asio::bind_cancellation_slot(cancel.slot(), asio::detached));
    asio::steady_timer wait(io);
    while (consumer_backend->transfers_in_flight() == 0) {
      wait.expires_after(std::chrono::milliseconds(1));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    cancel.emit(asio::cancellation_type::terminal);
    while (consumer_backend->transfers_cancelled() == 0) {
      wait.expires_after(std::chrono::milliseconds(1));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    // The fetch is answered once the get is, while the provider still holds
    // it: its bytes may still land, so its destination stays registered
    // (and allocated) until the transfer really ends.
    while (!cancelled) {
      wait.expires_after(std::chrono::milliseconds(1));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    held_when_answered = consumer_backend->transfers_in_flight();
    registered_when_answered = consumer_backend->live_registrations().value_or(0);
    consumer_backend->release_transfers();
    while (consumer_backend->live_registrations() != 0u) {
      wait.expires_after(std::chrono::milliseconds(1));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    next = co_await consumer->async_fetch("small");
    EXPECT_EQ(consumer->stats().fallbacks, 0u) << "a cancelled get fell back to the chunked path";
  }());
  ASSERT_TRUE(cancelled.has_value());
  ASSERT_FALSE(*cancelled);
  EXPECT_TRUE(cancelled->error().is(errc::cancelled)) << cancelled->error().message();
  EXPECT_EQ(held_when_answered, 1u) << "the fetch waited for the transfer to end";
  EXPECT_EQ(registered_when_answered, 1u) << "the destination was unregistered while its get could still write";
  ASSERT_TRUE(next.has_value());
  ASSERT_TRUE(*next) << next->error().message();
  EXPECT_EQ(std::vector<std::byte>(next->value().data.bytes().begin(), next->value().data.bytes().end()), small);
  EXPECT_EQ(owner->stats().live_leases, 0u) << "the cancelled fetch's lease was not released";
  EXPECT_EQ(consumer_registry->stats().regions, 0u);
}

TEST_F(Rendezvous, ADeadOwnerFailsAnRdmaFetchWithinSecondsNotAtTheTransferDeadline) {
  start_owner();
  consumer_backend->hold_transfers();  // the get never finishes by itself
  std::optional<corma::Result<corma::Fetched>> outcome;
  std::chrono::steady_clock::duration noticed{};
  std::size_t held_when_answered = 0;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    asio::co_spawn(io, fetch_into(*consumer, outcome), asio::detached);
    asio::steady_timer wait(io);
    while (consumer_backend->transfers_in_flight() == 0) {
      wait.expires_after(std::chrono::milliseconds(1));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    owner->stop();  // closes every connection: the owner is gone
    acceptor.close();
    const auto stopped = std::chrono::steady_clock::now();
    // The consumer must give up on the get by itself: it is cancelled.
    while (consumer_backend->transfers_cancelled() == 0 &&
           std::chrono::steady_clock::now() - stopped < std::chrono::seconds(10)) {
      wait.expires_after(std::chrono::milliseconds(5));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    noticed = std::chrono::steady_clock::now() - stopped;
    // The fetch is answered while the provider still holds the get: it does
    // not wait for a transfer that a dead owner's provider may never end.
    while (!outcome) {
      wait.expires_after(std::chrono::milliseconds(5));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    held_when_answered = consumer_backend->transfers_in_flight();
    // The held transfer then ends, and only then does its destination's
    // registration go (its memory was kept until then).
    EXPECT_EQ(consumer_backend->live_registrations(), 1u);
    consumer_backend->release_transfers();
    while (consumer_backend->live_registrations() != 0u) {
      wait.expires_after(std::chrono::milliseconds(5));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }());
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(*outcome);
  EXPECT_TRUE(outcome->error().is(errc::peer_unreachable)) << outcome->error().message();
  EXPECT_LT(noticed, std::chrono::seconds(5)) << "the get was not cancelled when the owner went";
  EXPECT_EQ(held_when_answered, 1u) << "the fetch waited for the transfer to end";
}

}  // namespace
