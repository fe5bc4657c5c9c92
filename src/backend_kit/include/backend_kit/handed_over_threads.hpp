// A backend whose last reference goes inside a completion running on its own
// progress thread cannot join that thread: the thread tears the provider
// down alone. A process that returned from main meanwhile would run the
// provider libraries' destructors under that teardown (a crash at exit).
// Such threads are handed over here instead of being detached: each is
// joined once it has finished, and the process waits for them, a bounded
// time, before its static destructors run.
#pragma once

#include <chrono>
#include <thread>

namespace corma::backend_kit {

/// Takes over `thread`, which is the calling thread itself, to be joined
/// once it has called progress_thread_ending().
void hand_over_own_thread(std::thread& thread);

/// A progress thread's very last step, once its last provider handle is
/// gone.
void progress_thread_ending();

/// Waits until every handed-over thread has finished, or `bound` has
/// passed, and joins those that have; true when none is left. The process
/// does this at exit, for ten seconds at most.
bool join_handed_over_threads(std::chrono::milliseconds bound);

}  // namespace corma::backend_kit
