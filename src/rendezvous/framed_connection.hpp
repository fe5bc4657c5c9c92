// A TCP connection that carries rendezvous frames: length-prefixed, size
// limited before anything is read, every read and write under a deadline.
#pragma once

#include "messages.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
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
  /// Writes a `data` frame answering `request_id` straight from `bytes`
  /// (no copy into a message or a frame buffer). `bytes` must stay valid
  /// until the write completes.
  asio::awaitable<Result<void>> write_data(std::uint64_t request_id, std::uint64_t offset,
                                           std::span<const std::byte> bytes, std::chrono::milliseconds timeout);
  /// Keeps a read buffer of up to `bytes` between frames (64 KiB by
  /// default): a side that reads large frames all the time (a consumer's
  /// data) then neither allocates nor faults in a buffer per frame.
  void keep_read_buffer_up_to(std::size_t bytes) noexcept { keep_capacity_ = bytes; }

  void set_max_frame_body(std::uint32_t max_body) noexcept { max_body_ = max_body; }
  void close() noexcept;
  [[nodiscard]] bool is_open() const noexcept { return socket_.is_open(); }
  [[nodiscard]] asio::ip::tcp::socket& socket() noexcept { return socket_; }

 private:
  asio::ip::tcp::socket socket_;
  /// Makes room for `capacity` bytes, keeping the first `kept`.
  void grow_body(std::size_t capacity, std::size_t kept);

  std::uint32_t max_body_;
  std::unique_ptr<std::byte[]> body_;  // not zero-filled: every byte used is read first
  std::size_t body_capacity_ = 0;
  std::size_t keep_capacity_ = 64 * 1024;
};

}  // namespace corma::rendezvous
