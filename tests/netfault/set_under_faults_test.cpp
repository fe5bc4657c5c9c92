// A set of objects moved across a faulty link by corma-set-peer processes:
// async_fetch_many over chunks and over RDMA, and push fetches (the owner
// writes each object into the consumer's landing), with 1 % loss at a 5 ms
// round trip, and through a 2 s partition in the middle of a round: every
// round the consumer finishes has every byte of every object right.
#include "netfault/network_pair.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace corma::netfault {
namespace {

using namespace std::chrono_literals;

struct SetCase {
  const char* name;
  const char* mode;  ///< many or push
  bool trusted;
  bool partitioned;  ///< cut for 2 s during the second round, else 1 % loss
  const char* count;  ///< objects of 64 KiB (pushes go one at a time: a round trip or two each)
};

class SetUnderFaults : public ::testing::TestWithParam<SetCase> {
 protected:
  void SetUp() override {
    if (auto why = NetworkPair::unavailable()) GTEST_SKIP() << *why;
  }
};

TEST_P(SetUnderFaults, EveryRoundArrivesWhole) {
  const auto& c = GetParam();
  // The partitioned cases at 100 Mbit/s, so that a round lasts a second or
  // two and the cut falls inside one.
  NetworkPair pair(LinkProfile{2500us, 0, 1000us, c.partitioned ? 0u : 10u,
                               c.partitioned ? 100'000'000u : 1'000'000'000u});
  ASSERT_TRUE(pair.ready()) << pair.why_not();
  std::vector<std::string> flags = {"--count", c.count, "--size", "65536"};
  if (c.trusted) flags.push_back("--trusted");
  std::vector<std::string> owner_args = {CORMA_SET_PEER, "owner", NetworkPair::address(Side::owner) + ":0"};
  owner_args.insert(owner_args.end(), flags.begin(), flags.end());
  auto owner = pair.start_in(Side::owner, owner_args);
  ASSERT_TRUE(owner.wait_for_output("listening on ")) << owner.captured;
  ASSERT_TRUE(owner.wait_for_output("\n")) << owner.captured;
  const auto at = owner.captured.find("listening on ") + 13;
  const auto peer = owner.captured.substr(at, owner.captured.find('\n', at) - at);

  std::vector<std::string> consumer_args = {CORMA_SET_PEER, "consumer", peer, c.mode, "--rounds", "3"};
  consumer_args.insert(consumer_args.end(), flags.begin(), flags.end());
  auto consumer = pair.start_in(Side::consumer, consumer_args);
  if (c.partitioned) {
    ASSERT_TRUE(consumer.wait_for_output("seconds ", 30s)) << "the first round did not end:\n" << consumer.captured;
    ASSERT_TRUE(pair.partition(Cut::both_ways));
    std::this_thread::sleep_for(2s);  // the fault itself, not a wait for an event
    ASSERT_TRUE(pair.heal());
  }
  const auto status = consumer.wait_exit(60s);
  ASSERT_TRUE(status) << "the consumer hung:\n" << consumer.captured;
  EXPECT_EQ(*status, 0) << consumer.captured;
  std::size_t rounds = 0;
  for (auto at_round = consumer.captured.find("seconds "); at_round != std::string::npos;
       at_round = consumer.captured.find("seconds ", at_round + 1)) {
    ++rounds;
  }
  EXPECT_EQ(rounds, 3u) << consumer.captured;
  EXPECT_FALSE(owner.wait_exit(0ms)) << "the owner died:\n" << owner.captured;
}

INSTANTIATE_TEST_SUITE_P(
    Sets, SetUnderFaults,
    ::testing::Values(SetCase{"many_chunked_loss_1pct", "many", false, false, "200"},
                      SetCase{"many_trusted_loss_1pct", "many", true, false, "200"},
                      SetCase{"push_trusted_loss_1pct", "push", true, false, "60"},
                      SetCase{"many_chunked_cut_2s", "many", false, true, "200"},
                      SetCase{"many_trusted_cut_2s", "many", true, true, "200"},
                      SetCase{"push_trusted_cut_2s", "push", true, true, "60"}),
    [](const auto& named) { return std::string(named.param.name); });

}  // namespace
}  // namespace corma::netfault
