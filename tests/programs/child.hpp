// What the programs that tests run as child processes share: how a run
// fails (a message and an exit status the parent reads) and a watchdog that
// turns a hang into an exit the parent can see, instead of a child it has
// to kill.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace corma::programs {

/// Exit statuses the parent tells apart.
inline constexpr int exit_failed = 1;
inline constexpr int exit_hung = 2;
inline constexpr int exit_usage = 64;
/// The situation the program exists to create could not be made here.
inline constexpr int exit_not_made = 3;

[[noreturn]] inline void fail_run(const std::string& why) {
  std::fprintf(stderr, "FAILED: %s\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(exit_failed);
}

/// Ends the process with exit_hung, saying `what()`, unless destroyed within
/// `limit`. _Exit, not exit: threads stuck in a provider must not run
/// static destructors under it.
template <class What>
class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds limit, What what)
      : what_(std::move(what)), thread_([this, limit] {
          std::unique_lock lock(mutex_);
          if (!done_cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "HANG: not done within %lld ms: %s\n", static_cast<long long>(limit.count()),
                         what_().c_str());
            std::fflush(stderr);
            std::_Exit(exit_hung);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  What what_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace corma::programs
