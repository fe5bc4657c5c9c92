// The owner's export table: a registration under way is waited for by name,
// and whoever waits is woken however it ends; evictions are counted from
// any thread.
#include "rendezvous/owner/export_table.hpp"

#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <thread>

namespace {

using corma::rendezvous::ExportTable;

TEST(ExportTable, ARegistrationUnderWayIsWaitedForByNameAndItsWaitersWokenWhenItEnds) {
  boost::asio::io_context io;
  ExportTable table(io.get_executor());
  EXPECT_EQ(table.waiter("a"), nullptr);
  EXPECT_EQ(table.ready("a", corma::PublishedObject{}), nullptr);
  bool woken = false;
  {
    const ExportTable::Registering registering(table, "a");
    auto waiter = table.waiter("a");
    ASSERT_NE(waiter, nullptr);
    EXPECT_EQ(table.waiter("b"), nullptr) << "only the name being registered";
    waiter->async_wait([&](boost::system::error_code) { woken = true; });
    io.poll();
    EXPECT_FALSE(woken) << "woken while the registration was still under way";
  }  // the registration ends (failed or not)
  io.poll();
  EXPECT_TRUE(woken);
  EXPECT_EQ(table.waiter("a"), nullptr);
}

TEST(ExportTable, EvictionsAreCountedFromAnyThread) {
  boost::asio::io_context io;
  ExportTable table(io.get_executor());
  const auto counted = table.eviction_counter();
  std::thread other([&] {
    for (int i = 0; i < 1000; ++i) counted();
  });
  for (int i = 0; i < 1000; ++i) counted();
  other.join();
  EXPECT_EQ(table.evicted(), 2000U);
}

}  // namespace
