// The owner's connection table: the caps on connections and handshakes read
// counts that follow each connection from its start to its end, however it
// ends; session ids are never given twice; stopping closes every connection
// and cancels every accept waited on.
#include "rendezvous/owner/connection_table.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <memory>
#include <optional>

namespace {

namespace asio = boost::asio;
using corma::rendezvous::ConnectionTable;
using corma::rendezvous::FramedConnection;

class ConnectionTableTest : public ::testing::Test {
 protected:
  asio::io_context io;

  std::shared_ptr<FramedConnection> connection() {
    asio::ip::tcp::socket socket(io);
    socket.open(asio::ip::tcp::v4());
    return std::make_shared<FramedConnection>(std::move(socket), 1024);
  }
};

TEST_F(ConnectionTableTest, HandshakesFillTheirCapUntilTheyEndAndConnectionsTheirsUntilTheyGo) {
  ConnectionTable table(3, 2);
  std::optional<ConnectionTable::Session> first(std::in_place, table, connection());
  EXPECT_FALSE(table.full());
  std::optional<ConnectionTable::Session> second(std::in_place, table, connection());
  EXPECT_EQ(table.handshakes(), 2U);
  EXPECT_TRUE(table.full()) << "two handshakes under way, and a third was let in";
  first->handshake_ended();
  first->handshake_ended();  // once only
  EXPECT_EQ(table.handshakes(), 1U);
  EXPECT_FALSE(table.full());
  const ConnectionTable::Session third(table, connection());
  EXPECT_EQ(table.size(), 3U);
  EXPECT_TRUE(table.full()) << "three connections open, and a fourth was let in";
  second.reset();  // gone in its handshake: both places freed
  EXPECT_EQ(table.handshakes(), 1U);
  EXPECT_EQ(table.size(), 2U);
  EXPECT_FALSE(table.full());
}

TEST_F(ConnectionTableTest, SessionIdsAreNeverGivenTwice) {
  ConnectionTable table(10, 10);
  std::uint64_t first_id = 0;
  {
    const ConnectionTable::Session first(table, connection());
    first_id = first.id();
  }
  const ConnectionTable::Session second(table, connection());
  EXPECT_NE(second.id(), first_id);
  EXPECT_GT(second.id(), first_id);
}

TEST_F(ConnectionTableTest, StoppingClosesEveryConnectionAndCancelsTheAcceptsWaitedOn) {
  ConnectionTable table(10, 10);
  auto open = connection();
  const ConnectionTable::Session session(table, open);
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::optional<boost::system::error_code> accepted;
  {
    const ConnectionTable::Listening listening(table, acceptor);
    acceptor.async_accept([&](boost::system::error_code ec, asio::ip::tcp::socket) { accepted = ec; });
    table.stop_all();
    io.run();
  }
  ASSERT_TRUE(accepted.has_value());
  EXPECT_EQ(*accepted, asio::error::operation_aborted);
  EXPECT_TRUE(acceptor.is_open()) << "the caller's acceptor was closed";
  EXPECT_FALSE(open->is_open());

  // An acceptor no longer listed is not touched.
  accepted.reset();
  io.restart();
  acceptor.async_accept([&](boost::system::error_code ec, asio::ip::tcp::socket) { accepted = ec; });
  table.stop_all();
  io.poll();
  EXPECT_FALSE(accepted.has_value()) << "an accept nobody listed was cancelled";
  acceptor.close();
  io.run();
}

}  // namespace
