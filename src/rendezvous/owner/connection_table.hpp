// The owner's connections: those open, how many are still in their
// handshake, the session id each is given, and the acceptors serve() waits
// on. The caps on connections and handshakes are checked against the counts
// kept here, so no caller keeps one in step by hand. Used on the owner's
// executor alone.
#pragma once

#include "rendezvous/protocol/framed_connection.hpp"

#include <boost/asio/ip/tcp.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>

namespace corma::rendezvous {

class ConnectionTable {
 public:
  ConnectionTable(std::size_t max_connections, std::size_t max_handshakes)
      : max_connections_(max_connections), max_handshakes_(max_handshakes) {}

  /// Whether a newcomer must be turned away: as many connections open, or
  /// as many still in their handshake, as the owner takes.
  [[nodiscard]] bool full() const noexcept {
    return connections_.size() >= max_connections_ || handshakes_ >= max_handshakes_;
  }

  /// One connection, listed from its start (open) to its end (when the
  /// Session goes), counted as a handshake until handshake_ended().
  class Session {
   public:
    Session(ConnectionTable& table, std::shared_ptr<FramedConnection> connection);
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    ~Session();
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
    /// Its hello is over (answered or refused): it no longer holds a place
    /// among the handshakes.
    void handshake_ended() noexcept;

   private:
    ConnectionTable& table_;
    std::shared_ptr<FramedConnection> connection_;
    std::uint64_t id_;
    bool in_handshake_ = true;
  };

  /// An acceptor serve() waits on, listed while this lives.
  class Listening {
   public:
    Listening(ConnectionTable& table, boost::asio::ip::tcp::acceptor& acceptor)
        : table_(table), at_(table.accepting_.insert(&acceptor)) {}
    Listening(const Listening&) = delete;
    Listening& operator=(const Listening&) = delete;
    ~Listening() { table_.accepting_.erase(at_); }

   private:
    ConnectionTable& table_;
    std::multiset<boost::asio::ip::tcp::acceptor*>::iterator at_;
  };

  /// Owner::stop: the accepts of every acceptor listed are cancelled (the
  /// acceptors stay open: they are the caller's), and every connection is
  /// closed.
  void stop_all();

  [[nodiscard]] std::size_t size() const noexcept { return connections_.size(); }
  [[nodiscard]] std::size_t handshakes() const noexcept { return handshakes_; }

 private:
  std::size_t max_connections_;
  std::size_t max_handshakes_;
  std::set<std::shared_ptr<FramedConnection>> connections_;
  std::multiset<boost::asio::ip::tcp::acceptor*> accepting_;
  std::size_t handshakes_ = 0;
  std::uint64_t next_session_ = 1;
};

}  // namespace corma::rendezvous
