// An HTTP server answering the etcd calls an owner's Directory makes
// (/v3/lease/grant, /v3/kv/txn, /v3/lease/keepalive, /v3/lease/revoke) as
// a test scripts them, recording each: for the orders of events a real etcd
// cannot be made to stage (a keep-alive answered only after a withdrawal, a
// write failing right after its lease was granted). One request per
// connection, each answered with `Connection: close`.
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace corma::testing {

class FakeEtcd {
 public:
  struct Call {
    std::string path;
    nlohmann::json body;
  };
  struct Answer {
    boost::beast::http::status status = boost::beast::http::status::ok;
    nlohmann::json body = nlohmann::json::object();
  };
  /// Answers the call (the index-th so far), or none: the call is held
  /// until release().
  using Script = std::function<std::optional<Answer>(const Call& call, std::size_t index)>;

  FakeEtcd(boost::asio::io_context& io, Script script)
      : io_(io), acceptor_(io, {boost::asio::ip::make_address("127.0.0.1"), 0}), script_(std::move(script)) {
    boost::asio::co_spawn(io_, listen(), boost::asio::detached);
  }

  [[nodiscard]] std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  [[nodiscard]] const std::vector<Call>& calls() const noexcept { return calls_; }
  /// The paths called so far, in order.
  [[nodiscard]] std::vector<std::string> paths() const {
    std::vector<std::string> paths;
    for (const auto& call : calls_) paths.push_back(call.path);
    return paths;
  }
  [[nodiscard]] bool holding() const noexcept { return held_ != nullptr; }

  /// Answers the held call with `answer`.
  void release(Answer answer) {
    released_ = std::move(answer);
    if (held_) held_->cancel();
  }
  /// Accepts no more connections.
  void close() {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  }

 private:
  static constexpr auto as_result = boost::asio::as_tuple(boost::asio::use_awaitable);

  boost::asio::awaitable<void> listen() {
    for (;;) {
      auto [failed, socket] = co_await acceptor_.async_accept(as_result);
      if (failed) co_return;
      boost::asio::co_spawn(io_, answer(std::move(socket)), boost::asio::detached);
    }
  }

  boost::asio::awaitable<void> answer(boost::asio::ip::tcp::socket socket) {
    namespace http = boost::beast::http;
    boost::beast::flat_buffer buffer;
    http::request<http::string_body> request;
    if (auto [failed, n] = co_await http::async_read(socket, buffer, request, as_result); failed) co_return;
    calls_.push_back(Call{std::string(request.target()), nlohmann::json::parse(request.body(), nullptr, false)});
    auto answer = script_(calls_.back(), calls_.size() - 1);
    if (!answer) {
      boost::asio::steady_timer held(io_, boost::asio::steady_timer::time_point::max());
      held_ = &held;
      (void)co_await held.async_wait(as_result);
      held_ = nullptr;
      answer = std::move(released_);
    }
    http::response<http::string_body> response{answer->status, 11};
    response.set(http::field::content_type, "application/json");
    response.body() = answer->body.dump();
    response.keep_alive(false);
    response.prepare_payload();
    (void)co_await http::async_write(socket, response, as_result);
    boost::system::error_code ignored;
    socket.shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
  }

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  Script script_;
  std::vector<Call> calls_;
  boost::asio::steady_timer* held_ = nullptr;
  std::optional<Answer> released_;
};

}  // namespace corma::testing
