#include "rendezvous/consumer/in_flight_limit.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma::rendezvous {

namespace asio = boost::asio;

asio::awaitable<Result<InFlightLimit::Place>> InFlightLimit::enter() {
  // Waiters go in order: a newcomer does not pass one already waiting.
  if (in_flight_ < limit_ && waiting_.empty()) {
    ++in_flight_;
    co_return Place(this);
  }
  Waiter me(executor_);
  // Unlisted however the wait ends (a destroyed coroutine included).
  struct Listed {
    std::list<Waiter*>& list;
    std::list<Waiter*>::iterator at;
    Waiter& waiter;
    ~Listed() {
      if (!waiter.given) list.erase(at);
    }
  } listed{waiting_, waiting_.insert(waiting_.end(), &me), me};
  for (;;) {
    (void)co_await me.wake.async_wait(asio::as_tuple(asio::use_awaitable));
    auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) {
      // A place given meanwhile goes on to the next waiter.
      if (me.given) leave();
      co_return fail(errc::cancelled, "cancelled while it waited for one of the connection's places");
    }
    if (me.given) co_return Place(this);
  }
}

void InFlightLimit::leave() {
  if (waiting_.empty()) {
    --in_flight_;
    return;
  }
  // Handed over: the place stays taken, by the oldest waiter now.
  Waiter* next = waiting_.front();
  waiting_.pop_front();
  next->given = true;
  next->wake.cancel();
}

}  // namespace corma::rendezvous
