// A TCP connection that carries rendezvous frames: length-prefixed, size
// limited before anything is read, every read and write under a deadline.
#pragma once

#include "messages.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

namespace corma::rendezvous {

namespace asio = boost::asio;

class FramedConnection {
 public:
  FramedConnection(asio::ip::tcp::socket socket, std::uint32_t max_frame_body);

  /// The next frame: `timeout` when its first byte does not come within
  /// `wait` or the rest of it within `rest` (a peer that starts a frame must
  /// finish it promptly, however long it may stay silent between frames),
  /// `protocol` for anything malformed or oversized, `peer_unreachable` when
  /// the connection ends. The body grows with the bytes that actually
  /// arrive, never with what the length prefix claims.
  asio::awaitable<Result<Frame>> read(std::chrono::milliseconds wait, std::chrono::milliseconds rest);
  asio::awaitable<Result<Frame>> read(std::chrono::milliseconds timeout) { return read(timeout, timeout); }
  asio::awaitable<Result<void>> write(const Frame& frame, std::chrono::milliseconds timeout);

  void set_max_frame_body(std::uint32_t max_body) noexcept { max_body_ = max_body; }
  void close() noexcept;
  [[nodiscard]] bool is_open() const noexcept { return socket_.is_open(); }
  [[nodiscard]] asio::ip::tcp::socket& socket() noexcept { return socket_; }

 private:
  asio::ip::tcp::socket socket_;
  std::uint32_t max_body_;
  std::vector<std::byte> body_;
};

}  // namespace corma::rendezvous
