#include "rendezvous/protocol/framed_connection.hpp"

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

/// Drops the first `n` bytes of a buffer or of a gathered pair of them.
template <class Buffer>
void consume(Buffer& buffer, std::size_t n) {
  buffer += n;
}
void consume(std::array<asio::const_buffer, 2>& parts, std::size_t n) {
  for (auto& part : parts) {
    const auto step = std::min(n, part.size());
    part += step;
    n -= step;
  }
}

/// Runs a socket transfer against a deadline; the loser is cancelled. What
/// the socket can take or give at once is moved first without waiting (no
/// timer, no suspension): pipelined requests and small answers, the common
/// case, cost one system call each.
template <class Op, class Buffers>
asio::awaitable<Result<void>> transfer(asio::ip::tcp::socket& socket, Op op, Buffers buffers,
                                       std::chrono::milliseconds timeout, const char* what) {
  boost::system::error_code now_ec;
  while (asio::buffer_size(buffers) > 0) {
    const auto moved = op.now(socket, buffers, now_ec);
    if (now_ec == asio::error::would_block || now_ec == asio::error::try_again) break;
    if (now_ec) co_return connection_error(now_ec, what);
    consume(buffers, moved);
  }
  if (asio::buffer_size(buffers) == 0) co_return success();
  asio::steady_timer timer(socket.get_executor(), timeout);
  auto outcome = co_await (op(socket, buffers, as_result) || timer.async_wait(as_result));
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
  template <class Buffers, class Token>
  auto operator()(asio::ip::tcp::socket& s, const Buffers& b, Token&& t) const {
    return asio::async_write(s, b, std::forward<Token>(t));
  }
  template <class Buffers>
  std::size_t now(asio::ip::tcp::socket& s, const Buffers& b, boost::system::error_code& ec) const {
    return s.write_some(b, ec);
  }
};

std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

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
                                                      std::chrono::milliseconds rest, const DataLanding* landing) {
  // A buffer larger than this side keeps is given back when the connection
  // goes quiet, not after every frame: a stream of large frames reuses it.
  if (body_capacity_ > keep_capacity_) {
    boost::system::error_code ignored;
    if (socket_.available(ignored) == 0) {
      body_.reset();
      body_capacity_ = 0;
    }
  }
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
  if (landing != nullptr && length_bytes >= data_head_body) {
    CORMA_CO_TRY(co_await read_body(0, data_head_body, deadline));
    have = data_head_body;
    auto head = decode_data_head(std::span<const std::byte>(body_.get(), data_head_body), length.value());
    if (!head) {
      close();
      co_return std::move(head).error();
    }
    if (const auto& data = head.value()) {
      const auto into = (*landing)(*data);
      if (!into.empty() && into.size() == data->len) {
        CORMA_CO_TRY(co_await transfer(socket_, Reader{}, asio::buffer(into.data(), into.size()),
                                       left_until(deadline), "reading a frame"));
        co_return Frame{data->request_id, Data{data->offset, {}, data->len}};
      }
    }
  }
  CORMA_CO_TRY(co_await read_body(have, length_bytes, deadline));
  auto frame = decode_frame_body(std::span<const std::byte>(body_.get(), length_bytes));
  if (!frame) close();
  co_return frame;
}

asio::awaitable<Result<void>> FramedConnection::read_body(std::size_t have, std::size_t length,
                                                          std::chrono::steady_clock::time_point deadline) {
  while (have < length) {
    // Grow by what has arrived so far (doubling from one page), never by the
    // prefix's claim alone: a peer that announces a megabyte and sends
    // nothing costs a page, not a megabyte. A kept buffer is used whole.
    if (have == body_capacity_) grow_body(std::min(length, std::max<std::size_t>(2 * have, 4096)), have);
    const std::size_t step = std::min(length, body_capacity_) - have;
    CORMA_CO_TRY(co_await transfer(socket_, Reader{}, asio::buffer(body_.get() + have, step), left_until(deadline),
                                   "reading a frame"));
    have += step;
  }
  co_return success();
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
  const auto head = encode_data_head(request_id, offset, bytes.size());
  const std::array<asio::const_buffer, 2> parts{asio::buffer(head), asio::buffer(bytes.data(), bytes.size())};
  co_return co_await transfer(socket_, Writer{}, parts, timeout, "writing a frame");
}

void FramedConnection::close() noexcept {
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

}  // namespace corma::rendezvous
