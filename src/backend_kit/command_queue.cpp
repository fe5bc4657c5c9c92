#include "backend_kit/command_queue.hpp"

#include <boost/asio/post.hpp>

namespace corma::backend_kit {

void CommandQueue::push(Command command) {
  if (on_progress_thread()) {
    if (own_closed_) return;  // dropped: `command` dies here
    own_.push_back(std::move(command));  // the progress thread is awake: it is us
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;  // dropped, after the lock: `command` dies on return
    pending_.push_back(std::move(command));
    has_pending_.store(true, std::memory_order_release);
  }
  // Ordered after the push by the mutex: either the sleeper saw the command
  // in prepare_to_sleep(), or this sees it asleep and wakes it. The queue is
  // not closed yet, so its io_context still exists.
  if (sleeping_.load(std::memory_order_seq_cst) && sleeping_.exchange(false, std::memory_order_seq_cst)) {
    boost::asio::post(io_, [] {});
  }
}

std::size_t CommandQueue::run(std::vector<Command>& commands) {
  const std::size_t n = commands.size();
  for (auto& command : commands) command();
  commands.clear();  // keeps its capacity for the next turn
  return n;
}

std::size_t CommandQueue::run_all() {
  // Swapped out first: a command may push another, which waits for the next turn.
  own_running_.swap(own_);
  std::size_t n = run(own_running_);
  // Most turns of a busy loop find nothing from other threads: no lock then.
  // A push racing with this load is found on the next turn, or by
  // prepare_to_sleep(), which looks under the lock.
  if (!has_pending_.load(std::memory_order_acquire)) return n;
  {
    std::lock_guard lock(mutex_);
    has_pending_.store(false, std::memory_order_relaxed);
    running_.swap(pending_);
  }
  return n + run(running_);
}

bool CommandQueue::prepare_to_sleep() {
  if (!own_.empty()) return false;
  sleeping_.store(true, std::memory_order_seq_cst);
  std::lock_guard lock(mutex_);
  if (pending_.empty()) return true;
  sleeping_.store(false, std::memory_order_seq_cst);
  return false;
}

void CommandQueue::close() {
  std::vector<Command> dropped;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    dropped.swap(pending_);
  }
  own_closed_ = true;
  own_.clear();
}

}  // namespace corma::backend_kit
