// The owner's push peers: one per connection that asked for one, through
// the stages of its set-up (push_open offers it, push_connect completes it,
// pushes use it once it is ready), and the look-ups of the pushes under way
// on it, given up together when the connection goes. Used on the owner's
// executor alone.
#pragma once

#include <corma/backend.hpp>

#include <boost/asio/cancellation_signal.hpp>

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>

namespace corma::rendezvous {

class PushPeerTable {
 public:
  /// A push_open on `session` begins: false when the connection has a push
  /// peer already (or one being opened).
  bool begin_opening(std::uint64_t session);
  /// The backend offered `peer` for it.
  void offered(std::uint64_t session, PeerId peer);
  /// The offered peer, now being connected (push_connect); nothing when no
  /// offer waits for it.
  std::optional<PeerId> begin_connecting(std::uint64_t session);
  /// The peer is connected: pushes may use it.
  void connected(std::uint64_t session);
  /// Opening or connecting failed: the connection has no push peer (the
  /// caller closes one the backend made).
  void forget(std::uint64_t session);

  /// The peer pushes on `session` write through; nothing until it is ready.
  [[nodiscard]] std::optional<PeerId> ready(std::uint64_t session) const;

  /// A push's look-up under way on `session`, listed while this lives: its
  /// slot is emitted when give_up_lookups() is called for the session. The
  /// session must have a ready peer, which outlives every push on it.
  class LookUp {
   public:
    LookUp(PushPeerTable& table, std::uint64_t session);
    LookUp(const LookUp&) = delete;
    LookUp& operator=(const LookUp&) = delete;
    ~LookUp() { lookups_.erase(at_); }
    [[nodiscard]] boost::asio::cancellation_slot slot() { return at_->slot(); }

   private:
    std::list<boost::asio::cancellation_signal>& lookups_;
    std::list<boost::asio::cancellation_signal>::iterator at_;
  };

  /// The connection went: the look-ups its pushes wait for are given up.
  void give_up_lookups(std::uint64_t session);
  /// The session ended: its entry goes, and the peer the backend made for
  /// it (offered or later), if any, is returned to be closed.
  std::optional<PeerId> take(std::uint64_t session);

  [[nodiscard]] std::size_t size() const noexcept { return peers_.size(); }

 private:
  enum class Stage { opening, offered, connecting, ready };
  struct Entry {
    Stage stage = Stage::opening;
    PeerId peer{};
    std::list<boost::asio::cancellation_signal> lookups;
  };
  std::unordered_map<std::uint64_t, Entry> peers_;
};

}  // namespace corma::rendezvous
