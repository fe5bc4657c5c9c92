// The rendezvous API as Asio initiating functions: Consumer::connect,
// async_fetch, async_fetch_into and Owner::serve take any completion token:
// callbacks (with their executor and cancellation slot), deferred, use_future
// and use_awaitable (the default, used everywhere else in these tests).
#include "rendezvous/rendezvous_fixture.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_future.hpp>

#include <future>
#include <optional>
#include <thread>

namespace {

using namespace corma::testing::rendezvous;
using corma::Consumer;
using corma::errc;
using corma::Fetched;
using corma::Result;

/// Runs `io` until `done` holds or a bound passes; false on the bound.
template <class Done>
bool run_until(asio::io_context& io, Done done) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  io.restart();
  while (!done() && std::chrono::steady_clock::now() < limit) io.run_one_for(std::chrono::milliseconds(50));
  return done();
}

class CompletionTokens : public Rendezvous {
 protected:
  /// A consumer connected with a plain callback.
  std::unique_ptr<Consumer> connect_with_callback() {
    std::optional<Result<std::unique_ptr<Consumer>>> connected;
    Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, {},
                      [&](Result<std::unique_ptr<Consumer>> r) { connected.emplace(std::move(r)); });
    if (!run_until(io, [&] { return connected.has_value(); })) throw std::runtime_error("connect never completed");
    if (!*connected) throw std::runtime_error(connected->error().message());
    return std::move(connected->value());
  }
};

TEST_F(CompletionTokens, CallbacksRunOnTheirBoundExecutorOnceEach) {
  start_owner();
  auto consumer = connect_with_callback();
  auto strand = asio::make_strand(io);
  std::optional<Result<Fetched>> fetched;
  int calls = 0;
  bool on_strand = false;
  consumer->async_fetch("big", asio::bind_executor(strand, [&](Result<Fetched> r) {
                          ++calls;
                          on_strand = strand.running_in_this_thread();
                          fetched.emplace(std::move(r));
                        }));
  ASSERT_TRUE(run_until(io, [&] { return fetched.has_value(); }));
  ASSERT_TRUE(*fetched) << fetched->error().message();
  EXPECT_EQ(fetched->value().path, corma::Path::rdma);
  ASSERT_EQ(fetched->value().data.size(), big.size());
  EXPECT_TRUE(std::equal(big.begin(), big.end(), fetched->value().data.bytes().begin()));
  EXPECT_TRUE(on_strand) << "the handler ran outside its bound executor";
  io.poll();
  EXPECT_EQ(calls, 1);
}

TEST_F(CompletionTokens, DeferredFetchesStartOnlyWhenLaunched) {
  start_owner();
  auto consumer = connect_with_callback();
  auto fetch_small = consumer->async_fetch("small", asio::deferred);
  io.restart();
  io.poll();
  EXPECT_EQ(owner->stats().decisions.chunked() + owner->stats().decisions.rdma, 0u) << "a deferred fetch ran unlaunched";
  std::optional<Result<Fetched>> fetched;
  std::move(fetch_small)([&](Result<Fetched> r) { fetched.emplace(std::move(r)); });
  ASSERT_TRUE(run_until(io, [&] { return fetched.has_value(); }));
  ASSERT_TRUE(*fetched) << fetched->error().message();
  EXPECT_EQ(fetched->value().path, corma::Path::chunked);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), fetched->value().data.bytes().begin()));
}

TEST_F(CompletionTokens, FuturesWaitFromAnotherThread) {
  start_owner();
  auto consumer = connect_with_callback();
  auto work = asio::make_work_guard(io);
  io.restart();
  std::thread runner([this] { io.run(); });
  auto fetched = consumer->async_fetch("big", asio::use_future);
  const bool ready = fetched.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  work.reset();
  asio::post(io, [this] { io.stop(); });
  runner.join();
  ASSERT_TRUE(ready) << "the fetch's future never became ready";
  auto result = fetched.get();
  ASSERT_TRUE(result) << result.error().message();
  EXPECT_TRUE(std::equal(big.begin(), big.end(), result.value().data.bytes().begin()));
}

TEST_F(CompletionTokens, ABoundCancellationSlotCancelsAFetchAndTheConnectionStaysUsable) {
  start_owner();
  auto consumer = connect_with_callback();
  asio::cancellation_signal cancel;
  std::optional<Result<Fetched>> cancelled;
  int calls = 0;
  consumer->async_fetch("big", asio::bind_cancellation_slot(cancel.slot(), [&](Result<Fetched> r) {
                          ++calls;
                          cancelled.emplace(std::move(r));
                        }));
  cancel.emit(asio::cancellation_type::terminal);
  ASSERT_TRUE(run_until(io, [&] { return cancelled.has_value(); }));
  ASSERT_FALSE(*cancelled) << "a fetch cancelled before it started completed anyway";
  EXPECT_TRUE(cancelled->error().is(errc::cancelled)) << cancelled->error().message();

  // The cancelled fetch gave its turn back: the next one is served.
  std::optional<Result<Fetched>> next;
  consumer->async_fetch("small", [&](Result<Fetched> r) { next.emplace(std::move(r)); });
  ASSERT_TRUE(run_until(io, [&] { return next.has_value(); }));
  ASSERT_TRUE(*next) << next->error().message();
  io.poll();
  EXPECT_EQ(calls, 1);
}

TEST_F(CompletionTokens, FetchIntoARegisteredRegionWithACallback) {
  start_owner();
  auto consumer = connect_with_callback();
  std::vector<std::byte> landing(big.size());
  std::optional<Result<corma::RegionGuard>> registered;
  // Bound to io: this thread reads `registered`.
  consumer_registry->async_register(
      landing, corma::Access::local,
      asio::bind_executor(io, [&](Result<corma::RegionGuard> r) { registered.emplace(std::move(r)); }));
  ASSERT_TRUE(run_until(io, [&] { return registered.has_value(); }));
  ASSERT_TRUE(*registered) << registered->error().message();
  std::optional<Result<corma::FetchOutcome>> outcome;
  consumer->async_fetch_into("big", registered->value(),
                             [&](Result<corma::FetchOutcome> r) { outcome.emplace(std::move(r)); });
  ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); }));
  ASSERT_TRUE(*outcome) << outcome->error().message();
  EXPECT_EQ(outcome->value().size, big.size());
  EXPECT_EQ(landing, big);
}

TEST_F(CompletionTokens, ServeWithACallbackCompletesOnceTheAcceptorCloses) {
  owner_registry = std::make_shared<corma::Registry>(owner_backend, corma::RegistryConfig{64 << 20, 0});
  owner = std::make_unique<corma::Owner>(io.get_executor(), owner_registry);
  owner->publish("small", corma::PublishedObject{small, nullptr});
  int served = 0;
  owner->serve(acceptor, [&] { ++served; });
  auto consumer = connect_with_callback();
  std::optional<Result<Fetched>> fetched;
  consumer->async_fetch("small", [&](Result<Fetched> r) { fetched.emplace(std::move(r)); });
  ASSERT_TRUE(run_until(io, [&] { return fetched.has_value(); }));
  ASSERT_TRUE(*fetched) << fetched->error().message();
  EXPECT_EQ(served, 0) << "serve completed while it still had an acceptor";
  owner->stop();
  acceptor.close();
  ASSERT_TRUE(run_until(io, [&] { return served != 0; })) << "serve never completed after the acceptor closed";
  io.poll();
  EXPECT_EQ(served, 1);
}

}  // namespace
