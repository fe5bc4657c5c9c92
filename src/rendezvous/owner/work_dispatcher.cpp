#include "rendezvous/owner/work_dispatcher.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma::rendezvous {

namespace asio = boost::asio;

WorkDispatcher::WorkDispatcher(asio::any_io_executor executor)
    : executor_(std::move(executor)), work_arrived_(executor_) {
  queue_.on_job_done = [this](std::uint64_t connection) {
    if (auto it = readers_waiting_.find(connection); it != readers_waiting_.end()) it->second->cancel();
  };
}

void WorkDispatcher::push(std::uint64_t connection, std::shared_ptr<Job> job) {
  queue_.push(connection, std::move(job));
  wake();
}

void WorkDispatcher::wake() {
  if (waiting_) work_arrived_.cancel();
}

asio::awaitable<void> WorkDispatcher::until_taken(std::uint64_t connection) {
  if (queue_.queued(connection) < max_jobs_queued) co_return;
  asio::steady_timer woken(executor_, asio::steady_timer::time_point::max());
  struct Listed {  // unlisted however the wait ends
    std::unordered_map<std::uint64_t, asio::steady_timer*>& readers;
    std::uint64_t connection;
    ~Listed() { readers.erase(connection); }
  } listed{readers_waiting_, connection};
  readers_waiting_[connection] = &woken;
  while (queue_.queued(connection) >= max_jobs_queued) {
    (void)co_await woken.async_wait(asio::as_tuple(asio::use_awaitable));
    woken.expires_at(asio::steady_timer::time_point::max());
  }
}

asio::awaitable<void> WorkDispatcher::run(std::function<bool()> stopping, std::function<void()> before_turn) {
  while (!stopping() || !queue_.empty()) {
    if (queue_.empty()) {
      waiting_ = true;
      work_arrived_.expires_at(asio::steady_timer::time_point::max());
      (void)co_await work_arrived_.async_wait(asio::as_tuple(asio::use_awaitable));
      waiting_ = false;
      continue;
    }
    // Once per turn, not per name: every name of the turn sees what changed
    // before its request arrived.
    before_turn();
    // A turn is bounded by time, not names: what a name costs varies a
    // hundredfold (a cached file, a first registration, a slow machine),
    // and a newcomer's request, read after this turn, goes first in the
    // next one (fair_queue.hpp), so it waits for about one turn.
    const auto turn_ends = std::chrono::steady_clock::now() + max_work_turn;
    do {
      queue_.run(FairQueue::units_per_go);
    } while (!queue_.empty() && std::chrono::steady_clock::now() < turn_ends);
    // The connections' reads and writes (a newcomer's hello among them) go
    // before the next turn.
    co_await asio::post(executor_, asio::use_awaitable);
  }
}

}  // namespace corma::rendezvous
