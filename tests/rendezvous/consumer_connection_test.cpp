// The consumer's connection: fetches run at once on one connection, RDMA
// gets included, each answer reaching its own request whatever order the
// owner answers in; fetches cancelled at random (running, or waiting for a
// place) never wedge it; and a dead owner is noticed at once even while an
// RDMA get waits.
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>

#include <deque>
#include <functional>
#include <optional>
#include <random>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;

/// An owner that answers every request in order after a short pause (or,
/// with `reverse_after`, holds the first that many and answers them last
/// first), and counts the requests that arrived while another was still
/// unanswered: of the same fetch (pulls of one lease, pipelined) or of
/// another (fetches talking at once).
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
  std::size_t reverse_after = 0;
  bool lapse_on_release = false;  // answers every release as an owner whose lease lapsed
  bool silent_after_hello = false;  // answers the hello, then nothing at all

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
    if (lapse_on_release) {
      return rv::ErrorReply{static_cast<std::uint16_t>(errc::region_not_found), "no such lease on this connection"};
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
      if (reverse_after > 0) {
        // After the hello: wait for `reverse_after` requests, answer them last first.
        if (requests > 1 && unanswered.size() < reverse_after && !closed) {
          arrived.expires_at(asio::steady_timer::time_point::max());
          co_await arrived.async_wait(asio::as_tuple(asio::use_awaitable));
          continue;
        }
        if (requests > 1) std::reverse(unanswered.begin(), unanswered.end());
        if (requests > 1) reverse_after = 0;
      }
      pause.expires_after(std::chrono::microseconds(300));
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      const auto& request = unanswered.front().frame;
      if (silent_after_hello && !std::holds_alternative<rv::Hello>(request.message)) {
        unanswered.pop_front();
        continue;
      }
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

/// Waits (running the io_context) until `done` holds, at most `limit`.
template <class Done>
asio::awaitable<void> poll_until(Done done, std::chrono::seconds limit = std::chrono::seconds(10)) {
  asio::steady_timer wait(co_await asio::this_coro::executor);
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < until) {
    wait.expires_after(std::chrono::milliseconds(1));
    co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

TEST_F(Rendezvous, AnswersInAnyOrderReachTheirOwnRequests) {
  // An owner that holds its answers until three acquires have come, then
  // answers them in reverse order.
  StrictOwner strict;
  strict.reverse_after = 3;
  asio::co_spawn(io, strict.serve(acceptor), asio::detached);
  Tally tally;
  tally.answers.assign(3, 0);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(nullptr)).value();
    for (int i = 0; i < 3; ++i) asio::co_spawn(io, fetch_and_count(*consumer, strict.object.size(), tally, i), asio::detached);
    co_await poll_until([&] { return tally.answered == 3; });
  }());
  strict.wait_until_done(io);
  EXPECT_EQ(tally.succeeded, 3);
  EXPECT_GT(strict.overlapping, 0) << "the fetches did not talk at once";
}

TEST_F(Rendezvous, APeerOfferedToAnOwnerThatDeclinesRdmaIsClosed) {
  // An owner without a registry takes no RDMA offer: the consumer's peer,
  // made for its hello, must not stay open with its backend.
  owner = std::make_unique<corma::Owner>(io.get_executor(), nullptr);
  owner->publish("small", corma::PublishedObject{small, nullptr});
  asio::co_spawn(io, owner->serve(acceptor), asio::detached);
  std::size_t open_while_connected = 1;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    EXPECT_EQ(consumer->stats().decisions.rdma, 0U);
    co_await poll_until([&] { return consumer_backend->open_peers() == 0; });
    open_while_connected = consumer_backend->open_peers();
    auto fetched = co_await consumer->async_fetch("small");
    EXPECT_TRUE(fetched) << fetched.error().message();
  }());
  EXPECT_EQ(open_while_connected, 0U) << "the declined peer was left open";
}

TEST_F(Rendezvous, AFetchWhoseLeaseTheOwnerNoLongerHeldAtItsReleaseFails) {
  // The owner's answer to the release says the lease had lapsed: nothing
  // proves the bytes one version, so the fetch does not report success.
  StrictOwner strict;
  strict.lapse_on_release = true;
  asio::co_spawn(io, strict.serve(acceptor), asio::detached);
  std::optional<corma::Result<corma::Fetched>> outcome;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(nullptr)).value();
    outcome = co_await consumer->async_fetch("object");
  }());
  strict.wait_until_done(io);
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(*outcome) << "a fetch whose lease lapsed reported success";
  EXPECT_TRUE(outcome->error().is(errc::timeout)) << outcome->error().message();
}

TEST_F(Rendezvous, AnOwnerSilentToARequestAndToTheHeartbeatThatFollowsIsGivenUp) {
  StrictOwner strict;
  strict.silent_after_hello = true;
  asio::co_spawn(io, strict.serve(acceptor), asio::detached);
  corma::ConsumerConfig config;
  config.io_timeout = std::chrono::milliseconds(100);
  std::optional<corma::Result<corma::Fetched>> outcome;
  std::chrono::steady_clock::duration took{};
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(), nullptr, config)).value();
    const auto start = std::chrono::steady_clock::now();
    outcome = co_await consumer->async_fetch("object");
    took = std::chrono::steady_clock::now() - start;
  }());
  strict.wait_until_done(io);
  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(*outcome) << "a silent owner's fetch succeeded";
  EXPECT_TRUE(outcome->error().is(errc::timeout)) << outcome->error().message();
  // The hello, the acquire, and the heartbeat that asked whether the owner lived.
  EXPECT_EQ(strict.requests, 3);
  EXPECT_LT(took, std::chrono::seconds(2)) << "a silent owner was waited for past two io timeouts";
}

/// `count` fetches of "big" at once on one connection with their gets held:
/// `while_held(consumer)` runs once all the gets are in flight, then they
/// are let go, and every fetch must have arrived whole by RDMA.
class HeldFetches : public Rendezvous {
 protected:
  void fetch_while_held(int count, const std::function<asio::awaitable<void>(corma::Consumer&)>& while_held,
                        corma::ConsumerConfig config = {}) {
    consumer_backend->hold_transfers();
    std::vector<std::optional<corma::Result<corma::Fetched>>> outcomes(static_cast<std::size_t>(count));
    corma::testing::run(io, [&]() -> asio::awaitable<void> {
      auto consumer =
          (co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, config))
              .value();
      for (auto& outcome : outcomes) {
        asio::co_spawn(io, [&consumer, &outcome]() -> asio::awaitable<void> {
          outcome = co_await consumer->async_fetch("big");
        }, asio::detached);
      }
      co_await poll_until([&] { return consumer_backend->transfers_in_flight() == static_cast<std::size_t>(count); });
      EXPECT_EQ(consumer_backend->transfers_in_flight(), static_cast<std::size_t>(count))
          << "the gets of one connection's fetches did not run at once";
      co_await while_held(*consumer);
      consumer_backend->release_transfers();
      co_await poll_until([&] { return std::all_of(outcomes.begin(), outcomes.end(), [](auto& o) { return o.has_value(); }); });
    }());
    for (auto& outcome : outcomes) {
      ASSERT_TRUE(outcome.has_value());
      ASSERT_TRUE(*outcome) << outcome->error().message();
      EXPECT_EQ(outcome->value().path, corma::Path::rdma);
      EXPECT_EQ(std::vector<std::byte>(outcome->value().data.bytes().begin(), outcome->value().data.bytes().end()), big);
    }
  }
};

TEST_F(HeldFetches, FetchesRunTheirRdmaGetsAtOnceOnOneConnection) {
  start_owner();
  fetch_while_held(6, [](corma::Consumer&) -> asio::awaitable<void> { co_return; });
}

TEST_F(HeldFetches, OneHeartbeatKeepsEveryLeaseOfTheConnectionPastManyLeaseTimeouts) {
  start_owner(64 << 20, corma::OwnerConfig{.lease_timeout = std::chrono::milliseconds(120),
                                           .reap_interval = std::chrono::milliseconds(10)});
  constexpr int fetches = 6;
  constexpr std::uint64_t beats = 4;  // about four lease timeouts while the gets are held
  fetch_while_held(fetches, [&](corma::Consumer& consumer) -> asio::awaitable<void> {
    co_await poll_until([&] { return consumer.stats().heartbeats >= beats; });
    EXPECT_GE(consumer.stats().heartbeats, beats);
    EXPECT_EQ(consumer.stats().renewals, 0U) << "a lease was renewed by a frame of its own";
    EXPECT_EQ(owner->stats().live_leases, static_cast<std::uint64_t>(fetches));
  });
  EXPECT_EQ(owner->stats().leases_expired, 0u) << "a lease lapsed while its fetch's get was held";
  EXPECT_GE(owner->stats().heartbeats, beats);
}

TEST_F(HeldFetches, AVersionThreeConsumerRenewsEachLeaseAndKeepsThemAll) {
  start_owner(64 << 20, corma::OwnerConfig{.lease_timeout = std::chrono::milliseconds(120),
                                           .reap_interval = std::chrono::milliseconds(10)});
  constexpr int fetches = 4;
  constexpr std::uint64_t renewals_each = 4;
  corma::ConsumerConfig version3;
  version3.protocol_version = 3;
  fetch_while_held(
      fetches,
      [&](corma::Consumer& consumer) -> asio::awaitable<void> {
        co_await poll_until([&] { return consumer.stats().renewals >= renewals_each * fetches; });
        EXPECT_GE(consumer.stats().renewals, renewals_each * fetches);
        EXPECT_EQ(consumer.stats().heartbeats, 0U);
        EXPECT_EQ(owner->stats().live_leases, static_cast<std::uint64_t>(fetches));
      },
      version3);
  EXPECT_EQ(owner->stats().leases_expired, 0u) << "a lease lapsed while its fetch's get was held";
}

TEST_F(Rendezvous, CancellingRunningAndWaitingFetchesAtRandomNeverWedgesTheConnection) {
  start_owner();
  corma::ConsumerConfig config;
  config.max_fetches_in_flight = 2;  // most fetches wait for a place
  std::mt19937 rng(7);
  corma::testing::run(
      io,
      [&]() -> asio::awaitable<void> {
        auto consumer = (co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, config)).value();
        int cancelled_total = 0;
        for (int round = 0; round < 20; ++round) {
          constexpr int fetches = 12;
          Tally tally;
          tally.answers.assign(fetches, 0);
          std::vector<asio::cancellation_signal> signals(fetches);
          for (int i = 0; i < fetches; ++i) {
            const char* name = i % 3 == 0 ? "big" : "small";
            asio::co_spawn(io,
                           [&consumer, &tally, i, name, this]() -> asio::awaitable<void> {
                             auto r = co_await consumer->async_fetch(name);
                             ++tally.answers[static_cast<std::size_t>(i)];
                             ++tally.answered;
                             if (r) {
                               ++tally.succeeded;
                               EXPECT_EQ(r.value().size, std::string(name) == "big" ? big.size() : small.size());
                             } else if (r.error().is(errc::cancelled)) {
                               ++tally.cancelled;
                             } else {
                               ADD_FAILURE() << "fetch " << i << ": " << r.error().message();
                             }
                           },
                           asio::bind_cancellation_slot(signals[static_cast<std::size_t>(i)].slot(), asio::detached));
          }
          // Cancel half of them at random moments: some while they wait for
          // a place, some while they run.
          asio::steady_timer pause(io);
          for (int i = 0; i < fetches; ++i) {
            if (rng() % 2 == 0) continue;
            pause.expires_after(std::chrono::microseconds(rng() % 400));
            co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
            if (tally.answers[static_cast<std::size_t>(i)] == 0) {
              signals[static_cast<std::size_t>(i)].emit(asio::cancellation_type::terminal);
            }
          }
          co_await poll_until([&] { return tally.answered == fetches; });
          EXPECT_EQ(tally.answered, fetches) << "round " << round << ": a fetch was never answered";
          for (int i = 0; i < fetches; ++i) EXPECT_LE(tally.answers[static_cast<std::size_t>(i)], 1);
          EXPECT_EQ(tally.succeeded + tally.cancelled, fetches);
          cancelled_total += tally.cancelled;
          if (tally.answered != fetches) co_return;
        }
        EXPECT_GT(cancelled_total, 0) << "no fetch was cancelled: the test did not test";
        // The connection still serves, and every lease went back.
        auto after = co_await consumer->async_fetch("small");
        EXPECT_TRUE(after) << after.error().message();
        co_await poll_until([&] { return owner->stats().live_leases == 0; });
        EXPECT_EQ(owner->stats().live_leases, 0u);
      }(),
      std::chrono::seconds(60));
}

asio::awaitable<void> fetch_into(corma::Consumer& consumer, std::optional<corma::Result<corma::Fetched>>& outcome) {
  outcome = co_await consumer.async_fetch("big");
}

TEST_F(Rendezvous, AFetchCancelledDuringItsRdmaGetKeepsItsLeaseUntilTheGetEndsThenStopsWithoutFallback) {
  start_owner();
  consumer_backend->hold_transfers();
  std::optional<corma::Result<corma::Fetched>> cancelled;
  std::optional<corma::Result<corma::Fetched>> next;
  bool answered_while_held = true;
  std::uint64_t leases_while_held = 0;
  std::size_t cancelled_in_provider = 0;
  asio::cancellation_signal cancel;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await connect(consumer_registry)).value();
    asio::co_spawn(io, fetch_into(*consumer, cancelled), asio::bind_cancellation_slot(cancel.slot(), asio::detached));
    co_await poll_until([&] { return consumer_backend->transfers_in_flight() == 1; });
    cancel.emit(asio::cancellation_type::terminal);
    // The get goes on under the fetch's lease: a provider cannot stop it,
    // and the owner's bytes it reads must outlive it. So the fetch is not
    // answered, and its lease not released, while the get is held.
    asio::steady_timer held(io, std::chrono::milliseconds(200));
    co_await held.async_wait(asio::as_tuple(asio::use_awaitable));
    answered_while_held = cancelled.has_value();
    leases_while_held = owner->stats().live_leases;
    cancelled_in_provider = consumer_backend->transfers_cancelled();
    consumer_backend->release_transfers();
    co_await poll_until([&] { return cancelled.has_value(); });
    co_await poll_until([&] { return owner->stats().live_leases == 0; });
    next = co_await consumer->async_fetch("small");
    EXPECT_EQ(consumer->stats().fallbacks, 0u) << "a cancelled get fell back to the chunked path";
    // The cancelled fetch's destination is unmapped by the provider after
    // its answer: the region count falls once that unmap is confirmed.
    co_await poll_until([&] { return consumer_registry->stats().regions == 0; });
  }());
  EXPECT_FALSE(answered_while_held) << "the fetch was answered while its get still read under the lease";
  EXPECT_EQ(leases_while_held, 1u) << "the lease went back while the get still read under it";
  EXPECT_EQ(cancelled_in_provider, 0u) << "the get was cancelled in the provider, which cannot stop it";
  ASSERT_TRUE(cancelled.has_value());
  ASSERT_FALSE(*cancelled);
  EXPECT_TRUE(cancelled->error().is(errc::cancelled)) << cancelled->error().message();
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
