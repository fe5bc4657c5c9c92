// Keeps a consumer's leases alive: every lease a fetch holds is renewed,
// together with the connection's others, every third of the shortest lease
// timeout (at least every second), however long the fetch takes: by one
// heartbeat frame for the whole connection (protocol version 4), or by a
// renew frame per lease (older owners). One keeper per connection; fetches
// only say which leases they hold.
#pragma once

#include "rendezvous/consumer/consumer_link.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>

namespace corma::rendezvous {

class LeaseKeeper : public std::enable_shared_from_this<LeaseKeeper> {
 public:
  explicit LeaseKeeper(std::shared_ptr<ConsumerLink> link);

  /// A lease kept alive while its ticket lives.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept : keeper_(std::move(other.keeper_)), lease_(other.lease_) {}
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { drop(); }
    /// Why the owner refused to renew the lease, if it did (it lapsed: its
    /// bytes may have been let go meanwhile).
    [[nodiscard]] std::optional<Error> lost() const;

   private:
    friend class LeaseKeeper;
    Ticket(std::shared_ptr<LeaseKeeper> keeper, std::uint64_t lease) : keeper_(std::move(keeper)), lease_(lease) {}
    void drop();
    std::shared_ptr<LeaseKeeper> keeper_;
    std::uint64_t lease_ = 0;
  };

  /// Keeps `lease` (granted with `timeout_ms`) alive until the ticket goes.
  Ticket keep(std::uint64_t lease, std::uint32_t timeout_ms);

  /// Renews until the connection ends or stop().
  void start();
  void stop();
  /// The owner speaks version 4: one heartbeat renews every lease.
  void use_heartbeat() noexcept { heartbeat_ = true; }

  [[nodiscard]] std::uint64_t renewals() const noexcept { return renewals_; }
  [[nodiscard]] std::uint64_t heartbeats() const noexcept { return heartbeats_; }

 private:
  struct Kept {
    std::uint32_t timeout_ms = 0;
    std::optional<Error> lost;
  };

  asio::awaitable<void> run(std::shared_ptr<LeaseKeeper> self);
  asio::awaitable<void> renew_all();
  asio::awaitable<void> send_heartbeat();
  [[nodiscard]] std::chrono::milliseconds interval() const;
  /// Stops keeping `lease` (if it is kept).
  void forget(std::uint64_t lease);

  std::shared_ptr<ConsumerLink> link_;
  std::map<std::uint64_t, Kept> kept_;
  /// How many kept leases have each timeout: the shortest sets the renewal
  /// interval, found without walking every lease (a set fetch keeps
  /// hundreds, one at a time).
  std::map<std::uint32_t, std::size_t> timeouts_;
  asio::steady_timer wake_;
  bool stopped_ = false;
  std::uint64_t renewals_ = 0;
  std::uint64_t heartbeats_ = 0;
  bool heartbeat_ = false;
};

}  // namespace corma::rendezvous
