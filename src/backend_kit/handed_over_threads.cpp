#include "backend_kit/handed_over_threads.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace corma::backend_kit {
namespace {

/// The threads handed over, each with whether it has ended its work.
class HandedOverThreads {
 public:
  /// Built on the first hand-over, after the provider libraries' statics,
  /// so at exit its destructor runs before theirs.
  static HandedOverThreads& instance() {
    static HandedOverThreads threads;
    return threads;
  }

  ~HandedOverThreads() {
    (void)join(std::chrono::seconds(10));
    std::lock_guard lock(mutex_);
    // Still tearing down after the bound: the process goes without it.
    for (auto& handed : threads_) handed.thread.detach();
  }

  void take(std::thread& thread) {
    std::lock_guard lock(mutex_);
    join_ended();  // those handed over before: their end is at most a return away
    threads_.push_back(Handed{std::move(thread), false});
  }

  void ended(std::thread::id id) {
    std::lock_guard lock(mutex_);
    for (auto& handed : threads_) {
      if (handed.thread.get_id() == id) handed.ended = true;
    }
    changed_.notify_all();
  }

  bool join(std::chrono::milliseconds bound) {
    std::unique_lock lock(mutex_);
    const bool all_ended = changed_.wait_for(lock, bound, [this] {
      return std::all_of(threads_.begin(), threads_.end(), [](const Handed& handed) { return handed.ended; });
    });
    join_ended();
    return all_ended;
  }

 private:
  struct Handed {
    std::thread thread;
    bool ended;
  };

  HandedOverThreads() = default;

  void join_ended() {
    std::erase_if(threads_, [](Handed& handed) {
      if (!handed.ended) return false;
      handed.thread.join();
      return true;
    });
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Handed> threads_;
};

}  // namespace

void hand_over_own_thread(std::thread& thread) { HandedOverThreads::instance().take(thread); }

void progress_thread_ending() { HandedOverThreads::instance().ended(std::this_thread::get_id()); }

bool join_handed_over_threads(std::chrono::milliseconds bound) { return HandedOverThreads::instance().join(bound); }

}  // namespace corma::backend_kit
