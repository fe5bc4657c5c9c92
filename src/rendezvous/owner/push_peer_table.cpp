#include "rendezvous/owner/push_peer_table.hpp"

namespace corma::rendezvous {

bool PushPeerTable::begin_opening(std::uint64_t session) { return peers_.try_emplace(session).second; }

void PushPeerTable::offered(std::uint64_t session, PeerId peer) {
  auto& entry = peers_.at(session);
  entry.peer = peer;
  entry.stage = Stage::offered;
}

std::optional<PeerId> PushPeerTable::begin_connecting(std::uint64_t session) {
  auto it = peers_.find(session);
  if (it == peers_.end() || it->second.stage != Stage::offered) return std::nullopt;
  it->second.stage = Stage::connecting;
  return it->second.peer;
}

void PushPeerTable::connected(std::uint64_t session) { peers_.at(session).stage = Stage::ready; }

void PushPeerTable::forget(std::uint64_t session) { peers_.erase(session); }

std::optional<PeerId> PushPeerTable::ready(std::uint64_t session) const {
  auto it = peers_.find(session);
  if (it == peers_.end() || it->second.stage != Stage::ready) return std::nullopt;
  return it->second.peer;
}

PushPeerTable::LookUp::LookUp(PushPeerTable& table, std::uint64_t session)
    : lookups_(table.peers_.at(session).lookups), at_(lookups_.emplace(lookups_.end())) {}

void PushPeerTable::give_up_lookups(std::uint64_t session) {
  auto it = peers_.find(session);
  if (it == peers_.end()) return;
  // The resolver's answers come back through a post, so none of them
  // erases from the list while it is walked.
  for (auto& lookup : it->second.lookups) lookup.emit(boost::asio::cancellation_type::terminal);
}

std::optional<PeerId> PushPeerTable::take(std::uint64_t session) {
  auto it = peers_.find(session);
  if (it == peers_.end()) return std::nullopt;
  const bool made = it->second.stage != Stage::opening;
  const auto peer = it->second.peer;
  peers_.erase(it);
  if (!made) return std::nullopt;
  return peer;
}

}  // namespace corma::rendezvous
