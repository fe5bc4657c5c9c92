// At most so many operations at once; the others wait their turn, and one
// cancelled while it waits leaves without having taken a place. A place that
// frees is handed to the oldest waiter directly (it is never free while
// someone waits), so no wake-up can be lost or shared: two places freed
// before either waiter runs go to two waiters.
#pragma once

#include <corma/error.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstddef>
#include <list>

namespace corma::rendezvous {

class InFlightLimit {
 public:
  InFlightLimit(boost::asio::any_io_executor executor, std::size_t limit)
      : executor_(std::move(executor)), limit_(limit == 0 ? 1 : limit) {}

  /// A place taken, given back when it goes.
  class Place {
   public:
    explicit Place(InFlightLimit* limit = nullptr) : limit_(limit) {}
    Place(Place&& other) noexcept : limit_(std::exchange(other.limit_, nullptr)) {}
    Place& operator=(Place&&) = delete;
    Place(const Place&) = delete;
    Place& operator=(const Place&) = delete;
    ~Place() {
      if (limit_ != nullptr) limit_->leave();
    }

   private:
    InFlightLimit* limit_;
  };

  /// Waits for a place: `cancelled` when the caller's cancellation comes
  /// first (terminal, as every wait of a coroutine).
  boost::asio::awaitable<Result<Place>> enter();

  [[nodiscard]] std::size_t in_flight() const noexcept { return in_flight_; }

 private:
  /// A waiter: woken (its timer cancelled) once, when it is given a place.
  struct Waiter {
    explicit Waiter(const boost::asio::any_io_executor& ex)
        : wake(ex, boost::asio::steady_timer::time_point::max()) {}
    boost::asio::steady_timer wake;
    bool given = false;
  };

  /// A place goes: to the oldest waiter if there is one, else it is free.
  void leave();

  boost::asio::any_io_executor executor_;
  std::size_t limit_;
  std::size_t in_flight_ = 0;  ///< places taken, including those handed to waiters not yet running
  std::list<Waiter*> waiting_;  ///< oldest first
};

}  // namespace corma::rendezvous
