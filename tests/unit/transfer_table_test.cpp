// backend_kit::TransferTable: ids are never 0, find what they named while it
// is there, and nothing after it left, even once its slot is reused.
#include "backend_kit/transfer_table.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

namespace corma::backend_kit {
namespace {

struct Item {
  int value = 0;
};

TEST(TransferTable, FindsWhatAnIdNamesUntilItIsTaken) {
  TransferTable<Item> table;
  const auto a = table.insert(std::make_shared<Item>(Item{1}));
  const auto b = table.insert(std::make_shared<Item>(Item{2}));
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(table.size(), 2u);
  ASSERT_NE(table.find(a), nullptr);
  EXPECT_EQ(table.find(a)->value, 1);
  EXPECT_EQ(table.share(b)->value, 2);
  auto taken = table.take(a);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->value, 1);
  EXPECT_EQ(table.find(a), nullptr);
  EXPECT_EQ(table.take(a), nullptr) << "taken twice";
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.find(0), nullptr);
  EXPECT_EQ(table.find(~std::uint64_t{0}), nullptr);
}

TEST(TransferTable, AStaleIdDoesNotFindTheNextOccupantOfItsSlot) {
  TransferTable<Item> table;
  const auto first = table.insert(std::make_shared<Item>(Item{1}));
  table.take(first);
  const auto second = table.insert(std::make_shared<Item>(Item{2}));  // reuses the slot
  EXPECT_NE(first, second);
  EXPECT_EQ(table.find(first), nullptr);
  ASSERT_NE(table.find(second), nullptr);
  EXPECT_EQ(table.find(second)->value, 2);
}

TEST(TransferTable, VisitsEveryEntryAndSelectsByPredicate) {
  TransferTable<Item> table;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(table.insert(std::make_shared<Item>(Item{i})));
  table.take(ids[3]);
  std::set<int> seen;
  table.for_each([&](std::uint64_t id, const std::shared_ptr<Item>& item) {
    EXPECT_EQ(table.find(id), item.get());
    seen.insert(item->value);
  });
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 4, 5, 6, 7, 8, 9}));
  const auto even = table.ids_where([](const Item& item) { return item.value % 2 == 0; });
  EXPECT_EQ(even.size(), 5u);  // 0, 2, 4, 6, 8
  for (auto id : even) EXPECT_EQ(table.find(id)->value % 2, 0);
  table.clear();
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.find(ids[0]), nullptr);
}

}  // namespace
}  // namespace corma::backend_kit
