// Memory for transfer ops (each op with its shared_ptr control block, as
// allocate_shared lays them out), recycled across threads. Sixty-four
// transfers in flight free sixty-four ops in one progress turn, and the
// turn's completions make sixty-four new ones: more than glibc's per-thread
// cache or Asio's recycling allocator keep (a few blocks each), so most went
// back to malloc's slow path. Each thread keeps a cache of free blocks of
// its own, taken from and given to without a lock; a cache that fills gives
// half of itself to a shared depot, and an empty one takes a batch from it
// (one lock per batch), so ops made on callers' threads and freed on the
// progress thread circulate too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

namespace corma::backend_kit {

/// Free blocks of one size, shared by every thread. Never destroyed: ops
/// may be freed after every engine (and static destructors) ran.
template <std::size_t BlockSize>
class BlockDepot {
 public:
  static constexpr std::size_t batch = 64;  ///< blocks moved between a thread's cache and the depot at once
  static constexpr std::size_t kept = 4096;  ///< beyond it, blocks go back to the system

  static BlockDepot& instance() {
    static BlockDepot* depot = new BlockDepot;  // immortal, see above
    return *depot;
  }

  /// Moves up to `batch` blocks into `into`; how many.
  std::size_t take(std::vector<void*>& into) {
    std::lock_guard lock(mutex_);
    const std::size_t n = std::min(batch, free_.size());
    into.insert(into.end(), free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
    free_.resize(free_.size() - n);
    return n;
  }

  /// Keeps the last `n` blocks of `from` (or frees those it has no room for).
  void give(std::vector<void*>& from, std::size_t n) {
    std::lock_guard lock(mutex_);
    for (; n > 0; --n) {
      void* block = from.back();
      from.pop_back();
      if (free_.size() < kept) {
        free_.push_back(block);
      } else {
        ::operator delete(block);
      }
    }
  }

 private:
  BlockDepot() { free_.reserve(kept); }
  std::mutex mutex_;
  std::vector<void*> free_;
};

/// One thread's free blocks of one size.
template <std::size_t BlockSize>
class BlockCache {
 public:
  static constexpr std::size_t capacity = 2 * BlockDepot<BlockSize>::batch;

  static void* allocate() {
    auto* cache = mine();
    if (cache == nullptr) return ::operator new(BlockSize);  // this thread is ending
    if (cache->free_.empty() && BlockDepot<BlockSize>::instance().take(cache->free_) == 0) {
      return ::operator new(BlockSize);
    }
    void* block = cache->free_.back();
    cache->free_.pop_back();
    return block;
  }

  static void deallocate(void* block) noexcept {
    auto* cache = mine();
    if (cache == nullptr) return ::operator delete(block);
    if (cache->free_.size() == capacity) BlockDepot<BlockSize>::instance().give(cache->free_, capacity / 2);
    cache->free_.push_back(block);
  }

 private:
  BlockCache() { free_.reserve(capacity); }
  ~BlockCache() {
    gone_ = true;
    BlockDepot<BlockSize>::instance().give(free_, free_.size());
  }

  /// This thread's cache, made on first use; null once the thread's
  /// thread-local objects are being destroyed.
  static BlockCache* mine() {
    if (gone_) return nullptr;
    thread_local BlockCache cache;
    return &cache;
  }

  static inline thread_local bool gone_ = false;  // trivially destructible: readable to the thread's very end
  std::vector<void*> free_;
};

/// The allocator allocate_shared uses for ops: single objects come from
/// the pool of their size, anything else from the system.
template <class T>
class OpAllocator {
 public:
  using value_type = T;
  OpAllocator() noexcept = default;
  template <class U>
  OpAllocator(const OpAllocator<U>& /*other*/) noexcept {}

  T* allocate(std::size_t n) {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "pooled blocks have operator new's alignment");
    if (n != 1) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(BlockCache<sizeof(T)>::allocate());
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n != 1) return ::operator delete(p);
    BlockCache<sizeof(T)>::deallocate(p);
  }

  template <class U>
  friend bool operator==(const OpAllocator& /*a*/, const OpAllocator<U>& /*b*/) noexcept {
    return true;
  }
};

}  // namespace corma::backend_kit
