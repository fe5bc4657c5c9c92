#include "in_flight_limit.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma::rendezvous {

namespace asio = boost::asio;

asio::awaitable<Result<InFlightLimit::Place>> InFlightLimit::enter() {
  asio::steady_timer turn(executor_);
  // Waiters go in order: a newcomer does not pass one already waiting, and
  // one woken without a place free keeps its place at the front.
  bool waited = false;
  while (in_flight_ >= limit_ || (!waited && !waiting_.empty())) {
    const auto at = waiting_.insert(waited ? waiting_.begin() : waiting_.end(), &turn);
    waited = true;
    turn.expires_at(asio::steady_timer::time_point::max());
    (void)co_await turn.async_wait(asio::as_tuple(asio::use_awaitable));
    waiting_.erase(at);
    auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) {
      // The wake-up this waiter may have been given goes to the next one.
      if (!waiting_.empty() && in_flight_ < limit_) waiting_.front()->cancel();
      co_return fail(errc::cancelled, "cancelled while it waited for one of the connection's places");
    }
  }
  ++in_flight_;
  co_return Place(this);
}

void InFlightLimit::leave() {
  --in_flight_;
  if (!waiting_.empty()) waiting_.front()->cancel();
}

}  // namespace corma::rendezvous
