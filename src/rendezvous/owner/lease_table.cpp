#include "rendezvous/owner/lease_table.hpp"

namespace corma::rendezvous {

std::uint64_t LeaseTable::add(Lease lease) {
  const std::uint64_t id = next_id_++;
  renew(lease);
  if (lease.windowed) ++windowed_;
  by_session_[lease.session].insert(id);
  leases_.emplace(id, std::move(lease));
  return id;
}

Lease* LeaseTable::held(std::uint64_t session, std::uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.session != session) return nullptr;
  return &it->second;
}

LeaseTable::Leases::iterator LeaseTable::erase(Leases::iterator it) {
  if (it->second.windowed) --windowed_;
  if (auto owner = by_session_.find(it->second.session); owner != by_session_.end()) {
    owner->second.erase(it->first);
    if (owner->second.empty()) by_session_.erase(owner);
  }
  return leases_.erase(it);
}

void LeaseTable::erase(std::uint64_t id) {
  if (auto it = leases_.find(id); it != leases_.end()) erase(it);
}

void LeaseTable::drop_session(std::uint64_t session) {
  auto owned = by_session_.find(session);
  if (owned == by_session_.end()) return;
  const auto ids = std::move(owned->second);
  by_session_.erase(owned);
  for (auto id : ids) erase(id);
}

std::size_t LeaseTable::expire(clock_type::time_point now) {
  std::size_t expired = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline < now) {
      it = erase(it);
      ++expired;
    } else {
      ++it;
    }
  }
  return expired;
}

void LeaseTable::clear(const std::function<void(Lease&)>& last) {
  for (auto& [id, lease] : leases_) last(lease);
  leases_.clear();
  by_session_.clear();
  windowed_ = 0;
}

std::uint32_t LeaseTable::renew_all(std::uint64_t session) {
  std::uint32_t renewed = 0;
  auto owned = by_session_.find(session);
  if (owned == by_session_.end()) return renewed;
  for (auto id : owned->second) {
    if (auto it = leases_.find(id); it != leases_.end()) {
      renew(it->second);
      ++renewed;
    }
  }
  return renewed;
}

void LeaseTable::acquire_began(std::uint64_t session) {
  ++acquiring_[session];
  ++acquiring_total_;
}

void LeaseTable::acquire_ended(std::uint64_t session) {
  if (auto it = acquiring_.find(session); it != acquiring_.end() && --it->second == 0) acquiring_.erase(it);
  --acquiring_total_;
}

std::size_t LeaseTable::places_of(std::uint64_t session) const {
  auto owned = by_session_.find(session);
  auto under_way = acquiring_.find(session);
  return (owned == by_session_.end() ? 0 : owned->second.size()) +
         (under_way == acquiring_.end() ? 0 : under_way->second);
}

}  // namespace corma::rendezvous
