// The owner's lease table: leases found only by the connection that holds
// them, the counts the lease caps and the windows' shares read kept in step
// however a lease ends (released, expired, its connection gone, the owner
// stopped).
#include "rendezvous/owner/lease_table.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace {

using corma::rendezvous::clock_type;
using corma::rendezvous::Lease;
using corma::rendezvous::LeaseTable;

Lease lease_of(std::uint64_t session, bool windowed = false) {
  Lease lease;
  lease.session = session;
  lease.name = "object";
  lease.windowed = windowed;
  return lease;
}

TEST(LeaseTable, ALeaseIsFoundOnlyByTheConnectionThatHoldsIt) {
  LeaseTable table(std::chrono::seconds(10));
  const auto first = table.add(lease_of(1));
  const auto second = table.add(lease_of(2));
  EXPECT_NE(first, second);
  ASSERT_NE(table.held(1, first), nullptr);
  EXPECT_EQ(table.held(2, first), nullptr) << "another connection's lease is as unknown as none";
  EXPECT_EQ(table.held(1, second), nullptr);
  EXPECT_EQ(table.held(1, 999), nullptr);
  table.erase(first);
  EXPECT_EQ(table.held(1, first), nullptr);
  table.erase(first);  // a second release finds nothing and changes nothing
  EXPECT_EQ(table.size(), 1U);
}

TEST(LeaseTable, EveryWayALeaseEndsKeepsTheCountsInStep) {
  LeaseTable table(std::chrono::seconds(10));
  const auto released = table.add(lease_of(1, true));
  table.add(lease_of(1, true));
  table.add(lease_of(1));
  table.add(lease_of(2, true));
  table.acquire_began(1);
  table.acquire_began(2);
  EXPECT_EQ(table.windowed(), 3U);
  EXPECT_EQ(table.places_of(1), 4U) << "three leases and an acquire under way";
  EXPECT_EQ(table.places(), 6U);

  table.erase(released);
  EXPECT_EQ(table.windowed(), 2U);
  EXPECT_EQ(table.places_of(1), 3U);
  table.acquire_ended(1);
  table.drop_session(1);  // its connection went
  EXPECT_EQ(table.places_of(1), 0U);
  EXPECT_EQ(table.windowed(), 1U);
  EXPECT_EQ(table.size(), 1U);

  std::vector<std::string> last;
  table.clear([&](Lease& lease) { last.push_back(lease.name); });
  EXPECT_EQ(last.size(), 1U) << "the owner stopped: each lease is handed over once";
  EXPECT_EQ(table.size(), 0U);
  EXPECT_EQ(table.windowed(), 0U);
  EXPECT_EQ(table.places(), 1U) << "the acquire still under way keeps its place";
  table.acquire_ended(2);
  EXPECT_EQ(table.places(), 0U);
}

TEST(LeaseTable, LeasesPastTheirDeadlineExpireAndARenewalKeepsOneAlive) {
  LeaseTable table(std::chrono::seconds(10));
  const auto renewed = table.add(lease_of(1));
  const auto lapsing = table.add(lease_of(1, true));
  const auto other = table.add(lease_of(2));
  table.held(1, lapsing)->deadline = clock_type::now() - std::chrono::seconds(1);
  table.held(2, other)->deadline = clock_type::now() - std::chrono::seconds(1);
  EXPECT_EQ(table.renew_all(2), 1U);  // the heartbeat of connection 2
  EXPECT_EQ(table.expire(clock_type::now()), 1U);
  EXPECT_NE(table.held(1, renewed), nullptr);
  EXPECT_EQ(table.held(1, lapsing), nullptr);
  EXPECT_NE(table.held(2, other), nullptr);
  EXPECT_EQ(table.windowed(), 0U);
  EXPECT_EQ(table.places_of(1), 1U);
  // Everything expires once its time is up.
  EXPECT_EQ(table.expire(clock_type::now() + std::chrono::seconds(11)), 2U);
  EXPECT_EQ(table.places(), 0U);
}

}  // namespace
