#include "key_watch.hpp"

#include "etcd_client.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace corma::directory {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

/// TCP keep-alive on the watch's connection: a silent etcd (a partition, a
/// dead host) is noticed within 5 + 3 * 2 = 11 s, the bound docs state.
void keep_alive(asio::ip::tcp::socket& socket) {
  boost::system::error_code ignored;
  socket.set_option(asio::socket_base::keep_alive(true), ignored);
  const int fd = socket.native_handle();
  const int idle = 5, interval = 2, probes = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

}  // namespace

struct KeyWatch::Stream {
  explicit Stream(EtcdStream connected) : stream(std::move(connected)) {}
  EtcdStream stream;
};

KeyWatch::KeyWatch(asio::any_io_executor executor, EtcdAccess access, std::string prefix,
                   std::chrono::milliseconds retry, Callbacks callbacks)
    : executor_(executor),
      access_(std::move(access)),
      prefix_(std::move(prefix)),
      retry_(retry),
      callbacks_(std::move(callbacks)),
      pause_(executor),
      stopping_(executor, asio::steady_timer::time_point::max()) {
  if (access_.members.empty()) access_.members.push_back(EtcdMember{"127.0.0.1", 2379});
}

void KeyWatch::start() {
  asio::co_spawn(executor_, [self = shared_from_this()]() { return self->run(); }, asio::detached);
}

void KeyWatch::stop() {
  stopped_ = true;
  callbacks_ = {};
  pause_.cancel();
  stopping_.cancel();
  if (stream_) {
    boost::system::error_code ignored;
    stream_->stream.tcp().socket().close(ignored);
  }
}

asio::awaitable<void> KeyWatch::run() {
  auto self = shared_from_this();
  while (!stopped_) {
    co_await watch_once();
    if (stopped_) co_return;
    if (live_ && callbacks_.live) callbacks_.live(false);
    live_ = false;
    current_ = (current_ + 1) % access_.members.size();  // the next member, in case this one is gone
    pause_.expires_after(retry_);
    (void)co_await pause_.async_wait(as_result);
  }
}

asio::awaitable<bool> KeyWatch::watch_once() {
  using namespace asio::experimental::awaitable_operators;
  if (stopped_) co_return false;  // else stopping_ was cancelled before this wait and never ends it
  const auto member = access_.members[current_];
  // Raced against stop(): the loser is cancelled (an Asio cancellation
  // slot of the spawned coroutine's own could be emitted after it ended).
  auto raced = co_await (EtcdStream::connect(executor_, access_, member, std::chrono::seconds(5)) ||
                         stopping_.async_wait(as_result));
  auto* connected = std::get_if<0>(&raced);
  if (!connected || !*connected || stopped_) co_return false;
  stream_ = std::make_shared<Stream>(std::move(*connected).value());
  auto stream = stream_;
  auto& etcd = stream->stream;
  etcd.tcp().expires_after(std::chrono::seconds(5));
  std::string token;
  if (!access_.credentials.user.empty()) {
    // A token of its own, asked for on this connection before the watch.
    auto asked = json_post(member.host, "/v3/auth/authenticate", authenticate_body(access_.credentials));
    asked.keep_alive(true);
    if (auto [written, n] = co_await etcd.visit([&](auto& s) { return http::async_write(s, asked, as_result); });
        written || stopped_) {
      co_return false;
    }
    beast::flat_buffer answer_buffer;
    http::response<http::string_body> answer;
    if (auto [read, n] =
            co_await etcd.visit([&](auto& s) { return http::async_read(s, answer_buffer, answer, as_result); });
        read || stopped_ || answer.result() != http::status::ok) {
      co_return false;
    }
    auto given = token_from(Json::parse(answer.body(), nullptr, false));
    if (!given) co_return false;
    token = std::move(given).value();
  }
  const Json create{{"create_request", {{"key", to_base64(prefix_)}, {"range_end", to_base64(prefix_end(prefix_))}}}};
  auto request = json_post(member.host, "/v3/watch", create, token);
  if (auto [written, n] = co_await etcd.visit([&](auto& s) { return http::async_write(s, request, as_result); });
      written || stopped_) {
    co_return false;
  }
  // The stream has no end: no deadline from here on; a dead etcd closes it,
  // and across a partition the connection's keep-alive ends it within
  // keepalive_idle + keepalive_probes * keepalive_interval.
  etcd.tcp().expires_never();
  keep_alive(etcd.tcp().socket());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(boost::none);
  if (auto [read, n] =
          co_await etcd.visit([&](auto& s) { return http::async_read_header(s, buffer, parser, as_result); });
      read || stopped_ || parser.get().result() != http::status::ok) {
    co_return false;
  }
  for (;;) {
    auto& body = parser.get().body();
    for (auto newline = body.find('\n'); newline != std::string::npos; newline = body.find('\n')) {
      const auto line = body.substr(0, newline);
      body.erase(0, newline + 1);
      if (!take(line)) co_return live_;
      if (stopped_) co_return live_;
    }
    if (parser.is_done()) co_return live_;
    auto [read, n] =
        co_await etcd.visit([&](auto& s) { return http::async_read_some(s, buffer, parser, as_result); });
    if (read || stopped_) co_return live_;
  }
}

bool KeyWatch::take(const std::string& line) {
  try {
    return take_result(line);
  } catch (const std::exception&) {
    return false;  // a line it cannot read (std::stoll included): a change may have been missed
  }
}

bool KeyWatch::take_result(const std::string& line) {
  auto message = Json::parse(line, nullptr, false);
  if (message.is_discarded() || !message.is_object() || !message.contains("result")) return false;
  const auto& result = message["result"];
  if (!result.is_object() || result.value("canceled", false)) return false;
  if (result.value("created", false) && !live_) {
    live_ = true;
    if (callbacks_.live) callbacks_.live(true);
  }
  if (!result.contains("events")) return true;
  const auto& events = result.at("events");
  if (!events.is_array()) return false;
  for (const auto& event : events) {
    if (!event.is_object()) return false;
    if (!event.contains("kv")) continue;
    const auto& kv = event.at("kv");
    auto key = from_base64(kv.value("key", ""));
    if (!key) return false;  // a change it cannot name is a change it missed
    Change change{std::move(key).value(), std::nullopt, 0};
    change.revision = std::stoll(kv.value("mod_revision", std::string("0")));  // etcd writes 64-bit integers as text
    if (event.value("type", std::string("PUT")) != "DELETE") {
      auto value = from_base64(kv.value("value", ""));
      if (!value) return false;
      change.value = std::move(value).value();
    }
    if (callbacks_.changed) callbacks_.changed(change);
  }
  return true;
}

}  // namespace corma::directory
