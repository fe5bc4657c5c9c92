#include "rendezvous/owner/connection_table.hpp"

namespace corma::rendezvous {

ConnectionTable::Session::Session(ConnectionTable& table, std::shared_ptr<FramedConnection> connection)
    : table_(table), connection_(std::move(connection)), id_(table.next_session_++) {
  table_.connections_.insert(connection_);
  ++table_.handshakes_;
}

ConnectionTable::Session::~Session() {
  handshake_ended();
  table_.connections_.erase(connection_);
}

void ConnectionTable::Session::handshake_ended() noexcept {
  if (!in_handshake_) return;
  in_handshake_ = false;
  --table_.handshakes_;
}

void ConnectionTable::stop_all() {
  for (auto* acceptor : accepting_) {
    boost::system::error_code ignored;
    acceptor->cancel(ignored);
  }
  for (const auto& connection : connections_) connection->close();
}

}  // namespace corma::rendezvous
