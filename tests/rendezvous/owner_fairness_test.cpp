// The owner's costly work taken in turns by cost: the fair queue itself, a
// newcomer's acquire answered ahead of another connection's backlog of
// batches, lease caps checked before a name is looked up, and names with
// bytes the protocol does not allow refused before any look-up.
#include "rendezvous/owner/fair_queue.hpp"
#include "rendezvous/rendezvous_fixture.hpp"

#include <string>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;

// ---- the queue alone ----

/// A job of `units` units that records, in `log`, its connection each time it runs.
class CountingJob final : public rv::Job {
 public:
  CountingJob(std::size_t units, char connection, std::string& log) : left_(units), connection_(connection), log_(log) {}
  std::size_t run(std::size_t budget) override {
    const auto done = std::min(budget, left_);
    left_ -= done;
    log_ += connection_;
    return done;
  }
  [[nodiscard]] bool finished() const override { return left_ == 0 || abandoned; }
  void abandon() override { abandoned = true; }
  bool abandoned = false;

 private:
  std::size_t left_;
  char connection_;
  std::string& log_;
};

TEST(FairQueue, ANewcomerGoesBeforeABacklogItDidNotQueueBehind) {
  rv::FairQueue queue;
  std::string log;
  for (int i = 0; i < 10; ++i) queue.push(1, std::make_shared<CountingJob>(100, 'a', log));
  EXPECT_EQ(queue.run(64), 64u);
  const auto before = log.size();
  queue.push(2, std::make_shared<CountingJob>(1, 'b', log));
  queue.run(64);
  EXPECT_EQ(log.substr(before, 2), "ba") << "the newcomer waited behind the backlog: " << log;
}

TEST(FairQueue, WorkIsSharedByUnitsNotByJobs) {
  rv::FairQueue queue;
  std::string log;
  // One connection queues batches of 64 units, the other single units.
  for (int i = 0; i < 4; ++i) queue.push(1, std::make_shared<CountingJob>(64, 'a', log));
  for (int i = 0; i < 256; ++i) queue.push(2, std::make_shared<CountingJob>(1, 'b', log));
  while (!queue.empty()) queue.run(64);
  // Each go of a batch (4 units) is followed by four single units.
  EXPECT_EQ(log.substr(0, 10), "abbbbabbbb") << log;
}

TEST(FairQueue, ADroppedConnectionsJobsAreAbandonedAndNeverRun) {
  rv::FairQueue queue;
  std::string log;
  auto queued = std::make_shared<CountingJob>(10, 'a', log);
  queue.push(1, queued);
  queue.drop(1);
  EXPECT_TRUE(queued->abandoned);
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(queue.run(64), 0u);
  EXPECT_EQ(log, "");
}

TEST(FairQueue, ANewcomerGoesAheadOfConnectionsLevelWithEachOtherButOnlyByOneGo) {
  rv::FairQueue queue;
  std::string log;
  // Three backlogged connections, in the middle of their second round: c
  // has had one go fewer than a and b.
  for (char c : {'a', 'b', 'c'}) queue.push(static_cast<std::uint64_t>(c), std::make_shared<CountingJob>(100, c, log));
  queue.run(5 * rv::FairQueue::units_per_go);
  EXPECT_EQ(log, "abcab");
  queue.push('n', std::make_shared<CountingJob>(3 * rv::FairQueue::units_per_go, 'n', log));
  queue.run(5 * rv::FairQueue::units_per_go);
  // The newcomer goes first, even before c, and is then level with c: one
  // go ahead, no more.
  EXPECT_EQ(log.substr(5), "ncnab") << log;
}

TEST(FairQueue, CountsEachConnectionsJobsAndSaysWhenOneEnds) {
  rv::FairQueue queue;
  std::string log;
  std::vector<std::uint64_t> ended;
  queue.on_job_done = [&ended](std::uint64_t connection) { ended.push_back(connection); };
  queue.push(1, std::make_shared<CountingJob>(rv::FairQueue::units_per_go, 'a', log));
  queue.push(1, std::make_shared<CountingJob>(2 * rv::FairQueue::units_per_go, 'a', log));
  EXPECT_EQ(queue.queued(1), 2u);
  EXPECT_EQ(queue.queued(2), 0u);
  queue.run(rv::FairQueue::units_per_go);
  EXPECT_EQ(queue.queued(1), 1u);
  EXPECT_EQ(ended, std::vector<std::uint64_t>{1});
  queue.run(rv::FairQueue::units_per_go);  // half of the second job: not ended
  EXPECT_EQ(ended.size(), 1u);
  queue.run(rv::FairQueue::units_per_go);
  EXPECT_EQ(queue.queued(1), 0u);
  EXPECT_EQ(ended, (std::vector<std::uint64_t>{1, 1}));
}

// ---- the owner ----

/// An owner whose objects come from a resolver that serves `count` small
/// objects named n0, n1... and writes down every name it is asked.
class FairOwner : public Rendezvous {
 protected:
  std::vector<std::string> looked_up;

  void start_resolving_owner(corma::OwnerConfig config = {}) {
    start_owner(64 << 20, config);
    owner->set_resolver([this](std::string_view name) -> corma::Result<corma::PublishedObject> {
      looked_up.emplace_back(name);
      return corma::PublishedObject{small, nullptr};
    });
  }

  /// Connects, says hello (version 2), and returns the client.
  asio::awaitable<RawClient> greeted_client() {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello = message(rv::Hello{});
    EXPECT_TRUE(co_await client.ask(std::move(hello)));
    co_return client;
  }
};

std::vector<std::string> batch_of_names(const std::string& prefix, std::size_t count) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < count; ++i) names.push_back(prefix + std::to_string(i));
  return names;
}

TEST_F(FairOwner, ANewcomersAcquireIsNotQueuedBehindAnotherConnectionsBacklogOfBatches) {
  corma::OwnerConfig config;  // every name of the flood is looked up
  config.max_leases_per_connection = 1 << 20;
  config.max_leases = 1 << 20;
  start_resolving_owner(config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto flooder = co_await greeted_client();
    // Twenty batches of 251 names, pipelined, answers never read.
    std::vector<std::byte> flood;
    for (std::uint64_t i = 0; i < 20; ++i) {
      auto bytes = rv::encode_frame(rv::Frame{100 + i, rv::AcquireMany{batch_of_names("a", 251), false}});
      flood.insert(flood.end(), bytes.begin(), bytes.end());
    }
    co_await asio::async_write(flooder.connection->socket(), asio::buffer(flood), asio::use_awaitable);
    (void)co_await until([&] { return looked_up.size() >= 251; }, std::chrono::seconds(5));
    // The owner reads ahead up to its per-connection limit of names
    // (1024): that much of the flood is queued now.
    auto newcomer = co_await greeted_client();
    const auto before = looked_up.size();
    auto acquire = message(rv::Acquire{"fresh", false});
    auto answer = co_await newcomer.ask(std::move(acquire));
    EXPECT_TRUE(answer && std::holds_alternative<rv::Chunked>(answer.value()));
    const auto at = std::find(looked_up.begin(), looked_up.end(), "fresh");
    EXPECT_NE(at, looked_up.end());
    const auto flood_names_between = static_cast<std::size_t>(at - looked_up.begin()) - before;
    std::printf("[ figure ] flood names looked up between the newcomer's acquire and its own: %zu of %zu\n",
                flood_names_between, looked_up.size() - before);
    EXPECT_LT(flood_names_between, 512u) << "the newcomer waited behind the flood's backlog";
    EXPECT_LT(looked_up.size(), 20u * 251u) << "the whole flood went first";
  }());
}

TEST_F(FairOwner, LeaseCapsAreCheckedBeforeANameIsLookedUp) {
  corma::OwnerConfig config;
  config.max_leases_per_connection = 4;
  start_resolving_owner(config);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await greeted_client();
    auto many = message(rv::AcquireMany{batch_of_names("n", 2), false});
    EXPECT_TRUE(co_await client.ask(std::move(many)));  // batch limit is 4 / 2 = 2
    auto more = message(rv::AcquireMany{batch_of_names("m", 2), false});
    EXPECT_TRUE(co_await client.ask(std::move(more)));
    EXPECT_EQ(looked_up.size(), 4u);
    auto refused = message(rv::AcquireMany{batch_of_names("x", 2), false});
    auto answer = co_await client.ask(std::move(refused));
    auto* granted = answer ? std::get_if<rv::Granted>(&answer.value()) : nullptr;
    EXPECT_NE(granted, nullptr);
    if (granted == nullptr) co_return;
    for (const auto& grant : granted->grants) {
      auto* error = std::get_if<rv::ErrorReply>(&grant);
      EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::budget_exceeded));
    }
    EXPECT_EQ(looked_up.size(), 4u) << "names refused at the lease cap were looked up";
  }());
}

TEST_F(FairOwner, NamesWithBytesTheProtocolForbidsAreRefusedUnlookedAndTheConnectionKept) {
  start_resolving_owner();
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    using namespace std::string_literals;
    auto client = co_await greeted_client();
    for (const auto& name : {"n0\0"s, "\0"s, "n\n0"s, "n0\x7f"s}) {
      auto acquire = message(rv::Acquire{name, false});
      EXPECT_TRUE(is_error(co_await client.ask(std::move(acquire)), errc::not_owned));
    }
    auto many = message(rv::AcquireMany{{"n0"s, "n1\0"s, "n2"s}, false});
    auto answer = co_await client.ask(std::move(many));
    auto* granted = answer ? std::get_if<rv::Granted>(&answer.value()) : nullptr;
    EXPECT_NE(granted, nullptr);
    if (granted == nullptr) co_return;
    EXPECT_EQ(granted->grants.size(), 3u);
    if (granted->grants.size() != 3) co_return;
    EXPECT_TRUE(std::holds_alternative<rv::Chunked>(granted->grants[0]));
    auto* error = std::get_if<rv::ErrorReply>(&granted->grants[1]);
    EXPECT_TRUE(error != nullptr && error->code == static_cast<std::uint16_t>(errc::not_owned));
    EXPECT_TRUE(std::holds_alternative<rv::Chunked>(granted->grants[2]));
    EXPECT_EQ(looked_up, (std::vector<std::string>{"n0", "n2"})) << "a forbidden name reached the resolver";
    auto after = message(rv::Acquire{"n3", false});
    auto served = co_await client.ask(std::move(after));
    EXPECT_TRUE(served && std::holds_alternative<rv::Chunked>(served.value())) << "the connection was not kept";
  }());
}

}  // namespace
