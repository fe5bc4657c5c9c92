// A TCP connection that carries rendezvous frames: length-prefixed, size
// limited before anything is read, every read and write under a deadline.
#pragma once

#include "rendezvous/protocol/messages.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace corma::rendezvous {

namespace asio = boost::asio;

/// Where a `data` frame's payload is read to, decided once its head is
/// read: exactly `head.len` bytes of memory, or an empty span to read the
/// frame the ordinary way (into `Data::bytes`).
using DataLanding = std::function<std::span<std::byte>(const DataHead& head)>;

class FramedConnection {
 public:
  FramedConnection(asio::ip::tcp::socket socket, std::uint32_t max_frame_body);

  /// The next frame: `timeout` when its first byte does not come within
  /// `wait` or the rest of it within `rest` (a peer that starts a frame must
  /// finish it promptly, however long it may stay silent between frames),
  /// `protocol` for anything malformed or oversized, `peer_unreachable` when
  /// the connection ends. The body grows with the bytes that actually
  /// arrive, never with what the length prefix claims.
  ///
  /// With a `landing`, a `data` frame's payload goes straight to the memory
  /// it names (the frame's `Data::landed` then says how many bytes, and
  /// `bytes` is empty): the bytes are copied once, by the kernel. The
  /// memory must stay valid until this read completes, however it ends.
  asio::awaitable<Result<Frame>> read(std::chrono::milliseconds wait, std::chrono::milliseconds rest,
                                      const DataLanding* landing = nullptr);
  asio::awaitable<Result<Frame>> read(std::chrono::milliseconds timeout) { return read(timeout, timeout); }
  asio::awaitable<Result<void>> write(const Frame& frame, std::chrono::milliseconds timeout);
  /// Writes a `data` frame answering `request_id` straight from `bytes`
  /// (no copy into a message or a frame buffer: its head and `bytes` go in
  /// one gathered write). `bytes` must stay valid until the write completes.
  asio::awaitable<Result<void>> write_data(std::uint64_t request_id, std::uint64_t offset,
                                           std::span<const std::byte> bytes, std::chrono::milliseconds timeout);
  /// The read buffer grows with the bytes that arrive and is kept between
  /// frames, so that a stream of large frames neither allocates nor faults
  /// in a buffer per frame. Past `bytes` (64 KiB by default) it is given
  /// back once no frame has needed it for `idle_release`.
  void keep_read_buffer_up_to(std::size_t bytes) noexcept { keep_capacity_ = bytes; }
  static constexpr std::chrono::seconds idle_release{1};
  /// The read buffer's size now (for tests).
  [[nodiscard]] std::size_t read_buffer_capacity() const noexcept { return body_capacity_; }

  void set_max_frame_body(std::uint32_t max_body) noexcept { max_body_ = max_body; }
  void close() noexcept;
  [[nodiscard]] bool is_open() const noexcept { return socket_.is_open(); }
  [[nodiscard]] asio::ip::tcp::socket& socket() noexcept { return socket_; }

 private:
  asio::ip::tcp::socket socket_;
  /// Makes room for `capacity` bytes, keeping the first `kept`.
  void grow_body(std::size_t capacity, std::size_t kept);
  /// Reads body bytes [have, length) into the read buffer, growing it by
  /// what has arrived, by `deadline`.
  asio::awaitable<Result<void>> read_body(std::size_t have, std::size_t length,
                                          std::chrono::steady_clock::time_point deadline);

  std::uint32_t max_body_;
  std::unique_ptr<std::byte[]> body_;  // not zero-filled: every byte used is read first
  std::size_t body_capacity_ = 0;
  std::size_t keep_capacity_ = 64 * 1024;
  /// When a frame last needed more than keep_capacity_ bytes of buffer.
  std::chrono::steady_clock::time_point large_frame_at_{};
};

}  // namespace corma::rendezvous
