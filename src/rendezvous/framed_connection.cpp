#include "framed_connection.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstring>

namespace corma::rendezvous {

using namespace asio::experimental::awaitable_operators;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

Error connection_error(const boost::system::error_code& ec, const char* what) {
  if (ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe) {
    return Error{errc::peer_unreachable, std::string(what) + ": connection closed by peer"};
  }
  return Error{errc::peer_unreachable, std::string(what) + ": " + ec.message()};
}

/// Runs a socket transfer against a deadline; the loser is cancelled. What
/// the socket can take or give at once is moved first without waiting (no
/// timer, no suspension): pipelined requests and small answers, the common
/// case, cost one system call each.
template <class Op, class Buffer>
asio::awaitable<Result<void>> transfer(asio::ip::tcp::socket& socket, Op op, Buffer buffer,
                                       std::chrono::milliseconds timeout, const char* what) {
  boost::system::error_code now_ec;
  while (buffer.size() > 0) {
    const auto moved = op.now(socket, buffer, now_ec);
    if (now_ec == asio::error::would_block || now_ec == asio::error::try_again) break;
    if (now_ec) co_return connection_error(now_ec, what);
    buffer += moved;
  }
  if (buffer.size() == 0) co_return success();
  asio::steady_timer timer(socket.get_executor(), timeout);
  auto outcome = co_await (op(socket, buffer, as_result) || timer.async_wait(as_result));
  if (outcome.index() == 1) {
    socket.close();
    co_return fail(errc::timeout, std::string(what) + ": peer silent past the deadline");
  }
  auto [ec, bytes] = std::get<0>(outcome);
  if (ec) co_return connection_error(ec, what);
  co_return success();
}

struct Reader {
  template <class Token>
  auto operator()(asio::ip::tcp::socket& s, asio::mutable_buffer b, Token&& t) const {
    return asio::async_read(s, b, std::forward<Token>(t));
  }
  std::size_t now(asio::ip::tcp::socket& s, asio::mutable_buffer b, boost::system::error_code& ec) const {
    const auto n = s.read_some(b, ec);
    if (!ec && n == 0) ec = asio::error::eof;
    return n;
  }
};
struct Writer {
  template <class Token>
  auto operator()(asio::ip::tcp::socket& s, asio::const_buffer b, Token&& t) const {
    return asio::async_write(s, b, std::forward<Token>(t));
  }
  std::size_t now(asio::ip::tcp::socket& s, asio::const_buffer b, boost::system::error_code& ec) const {
    return s.write_some(b, ec);
  }
};

}  // namespace

FramedConnection::FramedConnection(asio::ip::tcp::socket socket, std::uint32_t max_frame_body)
    : socket_(std::move(socket)), max_body_(max_frame_body) {
  // Requests are small and answered at once: Nagle's algorithm would hold
  // each one back behind the delayed ACK of the previous answer.
  boost::system::error_code ignored;
  socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
  // Synchronous attempts answer would_block instead of waiting (transfer()).
  socket_.non_blocking(true, ignored);
}

asio::awaitable<Result<Frame>> FramedConnection::read(std::chrono::milliseconds wait,
                                                      std::chrono::milliseconds rest) {
  std::array<std::byte, 4> prefix{};
  CORMA_CO_TRY(co_await transfer(socket_, Reader{}, asio::buffer(prefix.data(), 1), wait, "reading a frame"));
  CORMA_CO_TRY(co_await transfer(socket_, Reader{}, asio::buffer(prefix.data() + 1, 3), rest, "reading a frame"));
  auto length = decode_frame_length(prefix, max_body_);
  if (!length) {
    close();  // the stream cannot be resynchronised
    co_return std::move(length).error();
  }
  // The whole body must arrive within `rest`, however it is split.
  const auto deadline = std::chrono::steady_clock::now() + rest;
  const std::size_t length_bytes = length.value();
  std::size_t have = 0;
  while (have < length_bytes) {
    // Grow by what has arrived so far (doubling from one page), never by the
    // prefix's claim alone: a peer that announces a megabyte and sends
    // nothing costs a page, not a megabyte. A kept buffer is used whole.
    if (have == body_capacity_) grow_body(std::min(length_bytes, std::max<std::size_t>(2 * have, 4096)), have);
    const std::size_t step = std::min(length_bytes, body_capacity_) - have;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    CORMA_CO_TRY(co_await transfer(socket_, Reader{}, asio::buffer(body_.get() + have, step),
                                   std::max(left, std::chrono::milliseconds(0)), "reading a frame"));
    have += step;
  }
  auto frame = decode_frame_body(std::span<const std::byte>(body_.get(), length_bytes));
  // A buffer larger than this side keeps is not held for the connection's whole life.
  if (body_capacity_ > keep_capacity_) {
    body_.reset();
    body_capacity_ = 0;
  }
  if (!frame) close();
  co_return frame;
}

void FramedConnection::grow_body(std::size_t capacity, std::size_t kept) {
  auto fresh = std::make_unique_for_overwrite<std::byte[]>(capacity);
  if (kept != 0) std::memcpy(fresh.get(), body_.get(), kept);
  body_ = std::move(fresh);
  body_capacity_ = capacity;
}

asio::awaitable<Result<void>> FramedConnection::write(const Frame& frame, std::chrono::milliseconds timeout) {
  auto bytes = encode_frame(frame);
  co_return co_await transfer(socket_, Writer{}, asio::buffer(bytes), timeout, "writing a frame");
}

asio::awaitable<Result<void>> FramedConnection::write_data(std::uint64_t request_id, std::uint64_t offset,
                                                           std::span<const std::byte> bytes,
                                                           std::chrono::milliseconds timeout) {
  auto head = encode_data_head(request_id, offset, bytes.size());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  CORMA_CO_TRY(co_await transfer(socket_, Writer{}, asio::buffer(head), timeout, "writing a frame"));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  co_return co_await transfer(socket_, Writer{}, asio::buffer(bytes.data(), bytes.size()),
                              std::max(left, std::chrono::milliseconds(0)), "writing a frame");
}

void FramedConnection::close() noexcept {
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

}  // namespace corma::rendezvous
