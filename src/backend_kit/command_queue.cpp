#include "backend_kit/command_queue.hpp"

#include <boost/asio/post.hpp>

namespace corma::backend_kit {

void CommandQueue::push(Command command) {
  {
    std::lock_guard lock(mutex_);
    pending_.push_back(std::move(command));
  }
  // Ordered after the push by the mutex: either the sleeper saw the command
  // in prepare_to_sleep(), or this sees it asleep and wakes it.
  if (sleeping_.load(std::memory_order_seq_cst) && sleeping_.exchange(false, std::memory_order_seq_cst)) {
    boost::asio::post(io_, [] {});
  }
}

std::size_t CommandQueue::run_all() {
  {
    std::lock_guard lock(mutex_);
    if (pending_.empty()) return 0;
    running_.swap(pending_);
  }
  const std::size_t n = running_.size();
  for (auto& command : running_) command();
  running_.clear();
  return n;
}

bool CommandQueue::prepare_to_sleep() {
  sleeping_.store(true, std::memory_order_seq_cst);
  std::lock_guard lock(mutex_);
  if (pending_.empty()) return true;
  sleeping_.store(false, std::memory_order_seq_cst);
  return false;
}

}  // namespace corma::backend_kit
