// The owner's push peers: each connection's peer goes through its stages in
// order (offered, then connected, then used by pushes) and no other; a peer
// the backend made is handed back to be closed when its session ends, one
// still being offered is not; the look-ups of a connection's pushes are
// given up together, and only that connection's.
#include "rendezvous/owner/push_peer_table.hpp"

#include <gtest/gtest.h>

#include <optional>

namespace {

using corma::PeerId;
using corma::rendezvous::PushPeerTable;

TEST(PushPeerTable, APeerIsUsedOnlyOnceOfferedAndConnectedAndOpenedOncePerConnection) {
  PushPeerTable table;
  EXPECT_FALSE(table.begin_connecting(1).has_value()) << "connected with no offer";
  ASSERT_TRUE(table.begin_opening(1));
  EXPECT_FALSE(table.begin_opening(1)) << "a second push peer opened on one connection";
  EXPECT_FALSE(table.begin_connecting(1).has_value()) << "connected before the backend offered";
  table.offered(1, PeerId{7});
  EXPECT_FALSE(table.ready(1).has_value()) << "pushed through a peer only offered";
  EXPECT_EQ(table.begin_connecting(1), PeerId{7});
  EXPECT_FALSE(table.begin_connecting(1).has_value()) << "one offer connected twice";
  EXPECT_FALSE(table.ready(1).has_value());
  table.connected(1);
  EXPECT_EQ(table.ready(1), PeerId{7});
  EXPECT_FALSE(table.ready(2).has_value()) << "another connection's peer was lent";
}

TEST(PushPeerTable, ThePeerTheBackendMadeIsHandedBackToBeClosedWhenItsSessionEnds) {
  PushPeerTable table;
  ASSERT_TRUE(table.begin_opening(1));
  EXPECT_FALSE(table.take(1).has_value()) << "a peer still being offered was closed";
  EXPECT_EQ(table.size(), 0U);

  ASSERT_TRUE(table.begin_opening(2));
  table.offered(2, PeerId{9});
  EXPECT_EQ(table.take(2), PeerId{9});
  EXPECT_FALSE(table.take(2).has_value()) << "one peer handed back twice";

  // A failed connect forgets the peer (its caller closes it): nothing is left.
  ASSERT_TRUE(table.begin_opening(3));
  table.offered(3, PeerId{11});
  ASSERT_TRUE(table.begin_connecting(3).has_value());
  table.forget(3);
  EXPECT_FALSE(table.take(3).has_value());
  EXPECT_TRUE(table.begin_opening(3)) << "a connection whose connect failed cannot open again";
}

TEST(PushPeerTable, AConnectionsLookUpsAreGivenUpTogetherAndNoOtherConnections) {
  PushPeerTable table;
  for (std::uint64_t session : {1, 2}) {
    ASSERT_TRUE(table.begin_opening(session));
    table.offered(session, PeerId{session});
    ASSERT_TRUE(table.begin_connecting(session).has_value());
    table.connected(session);
  }
  int given_up_first = 0;
  int given_up_other = 0;
  {
    PushPeerTable::LookUp first(table, 1);
    PushPeerTable::LookUp second(table, 1);
    PushPeerTable::LookUp other(table, 2);
    first.slot().assign([&](boost::asio::cancellation_type) { ++given_up_first; });
    second.slot().assign([&](boost::asio::cancellation_type) { ++given_up_first; });
    other.slot().assign([&](boost::asio::cancellation_type) { ++given_up_other; });
    table.give_up_lookups(1);
    EXPECT_EQ(given_up_first, 2);
    EXPECT_EQ(given_up_other, 0);
  }
  // Look-ups that ended are not given up again.
  table.give_up_lookups(1);
  EXPECT_EQ(given_up_first, 2);
}

}  // namespace
