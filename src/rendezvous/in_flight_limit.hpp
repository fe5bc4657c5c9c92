// At most so many operations at once; the others wait their turn, and one
// cancelled while it waits leaves without having taken a place.
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
  void leave();

  boost::asio::any_io_executor executor_;
  std::size_t limit_;
  std::size_t in_flight_ = 0;
  std::list<boost::asio::steady_timer*> waiting_;  ///< oldest first; each cancelled when a place frees
};

}  // namespace corma::rendezvous
