// backend_kit's op pool: memory freed on one thread is handed to the next
// thread that allocates, whole ops go through allocate_shared with it, and a
// thread ending with blocks in its cache (or freeing after its cache went)
// loses nothing and crashes nothing.
#include "backend_kit/op_pool.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <memory>
#include <set>
#include <thread>
#include <vector>

namespace corma::backend_kit {
namespace {

// A size no other test object has, so that the pool it uses is this test's alone.
struct Odd {
  std::array<std::byte, 1234> bytes{};
};
using OddAllocator = OpAllocator<Odd>;

TEST(OpPool, BlocksFreedOnOneThreadAreReusedByAnother) {
  std::vector<Odd*> made;
  std::thread([&] {
    OddAllocator allocator;
    for (int i = 0; i < 200; ++i) made.push_back(allocator.allocate(1));
  }).join();
  const std::set<Odd*> freed(made.begin(), made.end());
  ASSERT_EQ(freed.size(), made.size());
  // Freed on a second thread, which ends: its cache goes to the depot.
  std::thread([&] {
    OddAllocator allocator;
    for (auto* block : made) allocator.deallocate(block, 1);
  }).join();

  std::thread([&] {
    OddAllocator allocator;
    std::vector<Odd*> again;
    for (int i = 0; i < 200; ++i) again.push_back(allocator.allocate(1));
    std::size_t reused = 0;
    for (auto* block : again) reused += freed.count(block);
    EXPECT_EQ(reused, again.size()) << "a third thread did not get the blocks the second one freed";
    for (auto* block : again) allocator.deallocate(block, 1);
  }).join();
}

TEST(OpPool, AnOpMadeWithAllocateSharedIsBuiltAndDestroyedInItsBlock) {
  struct Counted {
    explicit Counted(int& alive) : alive_(alive) { ++alive_; }
    ~Counted() { --alive_; }
    int& alive_;
    std::array<std::byte, 777> payload{};
  };
  int alive = 0;
  std::shared_ptr<Counted> op = std::allocate_shared<Counted>(OpAllocator<Counted>(), alive);
  EXPECT_EQ(alive, 1);
  const void* where = op.get();
  op.reset();
  EXPECT_EQ(alive, 0);
  // The same thread's next op reuses the block just freed.
  op = std::allocate_shared<Counted>(OpAllocator<Counted>(), alive);
  EXPECT_EQ(op.get(), where);
}

TEST(OpPool, ABlockFreedAfterItsThreadsCacheWentGoesBackToTheSystem) {
  // Thread-local objects end in the reverse order of their making: `late`
  // is made before the pool's cache, so it is destroyed after it, and the
  // block it frees then must not reach the destroyed cache: the sanitizer
  // builds report it if it does, and a plain build may crash.
  struct FreesAtExit {
    Odd* block = nullptr;
    ~FreesAtExit() {
      if (block != nullptr) OddAllocator().deallocate(block, 1);
    }
  };
  std::thread([] {
    thread_local FreesAtExit late;
    late.block = OddAllocator().allocate(1);
  }).join();
}

}  // namespace
}  // namespace corma::backend_kit
