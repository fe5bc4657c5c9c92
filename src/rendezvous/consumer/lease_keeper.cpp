#include "rendezvous/consumer/lease_keeper.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <vector>

namespace corma::rendezvous {

LeaseKeeper::LeaseKeeper(std::shared_ptr<ConsumerLink> link) : link_(std::move(link)), wake_(link_->executor()) {}

LeaseKeeper::Ticket& LeaseKeeper::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    drop();
    keeper_ = std::move(other.keeper_);
    lease_ = other.lease_;
  }
  return *this;
}

void LeaseKeeper::Ticket::drop() {
  if (keeper_) keeper_->forget(lease_);
  keeper_.reset();
}

std::optional<Error> LeaseKeeper::Ticket::lost() const {
  if (!keeper_) return std::nullopt;
  auto it = keeper_->kept_.find(lease_);
  return it == keeper_->kept_.end() ? std::nullopt : it->second.lost;
}

LeaseKeeper::Ticket LeaseKeeper::keep(std::uint64_t lease, std::uint32_t timeout_ms) {
  const bool was_idle = kept_.empty();
  const auto before = kept_.empty() ? std::chrono::milliseconds::max() : interval();
  forget(lease);  // kept again: its new timeout counts, not the old one
  kept_.emplace(lease, Kept{timeout_ms, std::nullopt});
  ++timeouts_[timeout_ms];
  // A shorter lease than any kept so far, or the first one: renew sooner.
  if (was_idle || interval() < before) wake_.cancel();
  return Ticket(shared_from_this(), lease);
}

void LeaseKeeper::stop() {
  stopped_ = true;
  wake_.cancel();
}

void LeaseKeeper::start() { asio::co_spawn(wake_.get_executor(), run(shared_from_this()), asio::detached); }

void LeaseKeeper::forget(std::uint64_t lease) {
  auto it = kept_.find(lease);
  if (it == kept_.end()) return;
  if (auto counted = timeouts_.find(it->second.timeout_ms); counted != timeouts_.end() && --counted->second == 0) {
    timeouts_.erase(counted);
  }
  kept_.erase(it);
}

std::chrono::milliseconds LeaseKeeper::interval() const {
  const std::uint32_t shortest = timeouts_.empty() ? 0xffffffffU : timeouts_.begin()->first;
  return std::clamp(std::chrono::milliseconds(shortest / 3), std::chrono::milliseconds(10),
                    std::chrono::milliseconds(1000));
}

asio::awaitable<void> LeaseKeeper::run([[maybe_unused]] std::shared_ptr<LeaseKeeper> self) {
  auto due = asio::steady_timer::clock_type::now();
  while (link_->is_open() && !stopped_) {
    if (kept_.empty()) {
      wake_.expires_at(asio::steady_timer::time_point::max());
      (void)co_await wake_.async_wait(asio::as_tuple(asio::use_awaitable));
      due = asio::steady_timer::clock_type::now() + interval();
      continue;
    }
    due = std::min(due, asio::steady_timer::clock_type::now() + interval());
    wake_.expires_at(due);
    auto [ec] = co_await wake_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec || stopped_) continue;  // woken: stopped, or a new lease may want an earlier renewal
    co_await renew_all();
    due = asio::steady_timer::clock_type::now() + interval();
  }
}

asio::awaitable<void> LeaseKeeper::send_heartbeat() {
  // Named, not a temporary: g++ 12 destroys a temporary argument of a
  // co_await expression twice.
  Message beat = Heartbeat{};
  auto answered = co_await link_->ask(std::move(beat));
  if (answered && std::holds_alternative<HeartbeatOk>(answered.value())) {
    ++heartbeats_;
    co_return;
  }
  if (!link_->is_open()) co_return;  // the connection's end says it all
  // Not renewed: none of the leases can be counted on any more.
  const auto why = answered ? std::string("the owner answered the heartbeat with something else")
                            : answered.error().message();
  for (auto& [lease, kept] : kept_) {
    if (!kept.lost) kept.lost = Error{errc::timeout, "the owner did not renew the connection's leases: " + why};
  }
}

asio::awaitable<void> LeaseKeeper::renew_all() {
  if (heartbeat_) {
    co_await send_heartbeat();
    co_return;
  }
  // All at once, then their answers: one round trip renews every lease.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> asked;  // (lease, request)
  for (const auto& [lease, kept] : kept_) {
    if (!kept.lost) asked.emplace_back(lease, link_->send(Renew{lease}));
  }
  for (const auto& [lease, request] : asked) {
    auto renewed = co_await link_->answer(request);
    if (renewed) {
      ++renewals_;
      continue;
    }
    if (!link_->is_open()) continue;  // the connection's end says it all
    if (auto it = kept_.find(lease); it != kept_.end()) {
      it->second.lost = Error{errc::timeout, "the owner let the lease lapse: " + renewed.error().message()};
    }
  }
}

}  // namespace corma::rendezvous
