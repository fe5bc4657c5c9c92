#include "etcd_client.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>

namespace corma::directory {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

Error unreachable(const std::string& what, const boost::system::error_code& ec) {
  return Error{errc::peer_unreachable, "etcd: " + what + ": " + ec.message()};
}

/// etcd's JSON mapping writes 64-bit integers as strings (and leaves zero
/// fields out).
std::int64_t int64_field(const Json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  if (it->is_number_integer()) return it->get<std::int64_t>();
  throw std::invalid_argument(std::string("etcd: field ") + name + " is not an integer");
}

}  // namespace

http::request<http::string_body> json_post(const std::string& host, const char* path, const Json& body,
                                           const std::string& token) {
  http::request<http::string_body> request{http::verb::post, path, 11};
  request.set(http::field::host, host);
  if (!token.empty()) request.set(http::field::authorization, token);
  request.set(http::field::content_type, "application/json");
  request.body() = body.dump();
  request.prepare_payload();
  return request;
}

std::string prefix_end(std::string prefix) {
  // The prefix with its last byte that is not 0xFF incremented, the rest dropped.
  while (!prefix.empty()) {
    auto& last = prefix.back();
    if (static_cast<unsigned char>(last) != 0xFF) {
      last = static_cast<char>(static_cast<unsigned char>(last) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Json authenticate_body(const EtcdCredentials& credentials) {
  return Json{{"name", credentials.user}, {"password", credentials.password}};
}

Result<std::string> token_from(const Json& answer) {
  if (!answer.is_object() || !answer.contains("token") || !answer["token"].is_string()) {
    return fail(errc::protocol, "etcd: authenticate answered no token");
  }
  return answer["token"].get<std::string>();
}

EtcdClient::EtcdClient(asio::any_io_executor executor, EtcdAccess access, std::chrono::milliseconds timeout)
    : executor_(std::move(executor)), access_(std::move(access)), timeout_(timeout) {
  if (access_.members.empty()) access_.members.push_back(EtcdMember{"127.0.0.1", 2379});
}

EtcdClient::EtcdClient(asio::any_io_executor executor, std::string host, std::uint16_t port,
                       std::chrono::milliseconds timeout)
    : EtcdClient(std::move(executor), EtcdAccess{{EtcdMember{std::move(host), port}}, {}, nullptr, std::nullopt},
                 timeout) {}

asio::awaitable<Result<EtcdStream>> EtcdClient::connection() {
  if (!idle_.empty()) {
    auto stream = std::move(idle_.back());
    idle_.pop_back();
    co_return stream;
  }
  co_return co_await EtcdStream::connect(executor_, access_, member(), timeout_);
}

asio::awaitable<Result<Json>> EtcdClient::call(const char* path, const Json& body) {
  // A connection kept from an earlier call may have been closed by etcd
  // (restarted, or idle too long): that one failure is retried once on a
  // fresh connection.
  // Then a member that cannot be reached is left for the next, each once.
  Result<Json> answer = fail(errc::peer_unreachable, "etcd: no member");
  for (std::size_t tried = 0; tried < access_.members.size(); ++tried) {
    const bool reused = !idle_.empty();
    answer = co_await call_authenticated(path, body);
    if (!answer && reused && answer.error().is(errc::peer_unreachable)) answer = co_await call_authenticated(path, body);
    if (answer || !answer.error().is(errc::peer_unreachable)) co_return answer;
    idle_.clear();  // connections to the member left behind
    current_ = (current_ + 1) % access_.members.size();
  }
  co_return answer;
}

asio::awaitable<Result<Json>> EtcdClient::call_authenticated(const char* path, const Json& body) {
  if (access_.credentials.user.empty()) co_return co_await call_once(path, body);
  for (int attempt = 0;; ++attempt) {
    if (token_.empty()) {
      const auto asked = authenticate_body(access_.credentials);
      CORMA_CO_TRY(auto answer, co_await call_once("/v3/auth/authenticate", asked));
      CORMA_CO_TRY(token_, token_from(answer));
    }
    auto answer = co_await call_once(path, body);
    // A token etcd no longer takes (expired, or from before its restart):
    // asked for again, once.
    if (answer || !answer.error().is(errc::not_owned) || attempt > 0) co_return answer;
    token_.clear();
  }
}

asio::awaitable<Result<Json>> EtcdClient::call_once(const char* path, const Json& body) {
  ++calls_;
  CORMA_CO_TRY(auto stream, co_await connection());
  auto request = json_post(member().host, path, body, token_);
  request.keep_alive(true);
  request.prepare_payload();
  stream.tcp().expires_after(timeout_);
  if (auto [ec, n] = co_await stream.visit([&](auto& s) { return http::async_write(s, request, as_result); }); ec) {
    co_return unreachable(path, ec);
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  if (auto [ec, n] = co_await stream.visit([&](auto& s) { return http::async_read(s, buffer, parser, as_result); });
      ec) {
    co_return unreachable(path, ec);
  }
  auto response = parser.release();
  Json answer = Json::parse(response.body(), nullptr, false);
  if (answer.is_discarded()) co_return fail(errc::protocol, "etcd: " + std::string(path) + " answered no JSON");
  if (response.result() != http::status::ok) {
    const auto message = answer.is_object() && answer.contains("message") ? answer["message"].dump() : response.body();
    // gRPC's UNAUTHENTICATED, and a failed authenticate: the credentials.
    const bool refused = response.result() == http::status::unauthorized ||
                         message.find("authentication failed") != std::string::npos;
    if (response.keep_alive()) idle_.push_back(std::move(stream));
    co_return fail(refused ? errc::not_owned : errc::backend, "etcd: " + std::string(path) + ": " + message);
  }
  if (response.keep_alive()) idle_.push_back(std::move(stream));
  co_return answer;
}

asio::awaitable<Result<std::int64_t>> EtcdClient::grant_lease(std::chrono::seconds ttl) {
  // Bodies are named, not temporaries in the co_await: g++ 12 miscompiles those.
  const Json body{{"TTL", std::to_string(ttl.count())}};
  CORMA_CO_TRY(auto answer, co_await call("/v3/lease/grant", body));
  try {
    const auto id = int64_field(answer, "ID");
    if (id == 0) co_return fail(errc::backend, "etcd granted no lease: " + answer.dump());
    co_return id;
  } catch (const std::exception& e) {
    co_return fail(errc::protocol, e.what());
  }
}

asio::awaitable<Result<void>> EtcdClient::keep_alive(std::int64_t lease) {
  const Json body{{"ID", std::to_string(lease)}};
  CORMA_CO_TRY(auto answer, co_await call("/v3/lease/keepalive", body));
  try {
    // The gateway streams keep-alive answers: one {"result": {...}} here.
    const auto& result = answer.contains("result") ? answer["result"] : answer;
    if (int64_field(result, "TTL") <= 0) co_return fail(errc::region_not_found, "etcd no longer has the lease");
    co_return success();
  } catch (const std::exception& e) {
    co_return fail(errc::protocol, e.what());
  }
}

asio::awaitable<Result<void>> EtcdClient::revoke(std::int64_t lease) {
  const Json body{{"ID", std::to_string(lease)}};
  CORMA_CO_TRY(co_await call("/v3/lease/revoke", body));
  co_return success();
}

asio::awaitable<Result<void>> EtcdClient::put(const std::string& key, const std::string& value, std::int64_t lease) {
  Json body{{"key", to_base64(key)}, {"value", to_base64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  CORMA_CO_TRY(co_await call("/v3/kv/put", body));
  co_return success();
}

asio::awaitable<Result<void>> EtcdClient::put_all(const std::vector<KeyValue>& kvs, std::int64_t lease) {
  for (std::size_t first = 0; first < kvs.size(); first += max_txn_ops) {
    Json puts = Json::array();
    for (std::size_t i = first; i < std::min(kvs.size(), first + max_txn_ops); ++i) {
      Json put{{"key", to_base64(kvs[i].key)}, {"value", to_base64(kvs[i].value)}};
      if (lease != 0) put["lease"] = std::to_string(lease);
      puts.push_back(Json{{"request_put", std::move(put)}});
    }
    const Json body{{"success", std::move(puts)}};
    CORMA_CO_TRY(co_await call("/v3/kv/txn", body));
  }
  co_return success();
}

asio::awaitable<Result<void>> EtcdClient::delete_all(const std::vector<std::string>& keys) {
  for (std::size_t first = 0; first < keys.size(); first += max_txn_ops) {
    Json deletes = Json::array();
    for (std::size_t i = first; i < std::min(keys.size(), first + max_txn_ops); ++i) {
      deletes.push_back(Json{{"request_delete_range", Json{{"key", to_base64(keys[i])}}}});
    }
    const Json body{{"success", std::move(deletes)}};
    CORMA_CO_TRY(co_await call("/v3/kv/txn", body));
  }
  co_return success();
}

namespace {

Json range_request(const std::string& prefix) {
  return Json{{"key", to_base64(prefix)}, {"range_end", to_base64(prefix_end(prefix))}};
}

/// A RangeResponse (or a transaction's response_range) as keys and values;
/// `revision` comes from the answer's header.
Result<RangeResult> parse_range(const Json& answer, std::int64_t revision) {
  try {
    RangeResult range;
    range.revision = revision;
    if (answer.contains("kvs")) {
      for (const auto& kv : answer["kvs"]) {
        CORMA_TRY(auto key, from_base64(kv.value("key", "")));
        CORMA_TRY(auto value, from_base64(kv.value("value", "")));
        range.kvs.push_back(KeyValue{std::move(key), std::move(value), int64_field(kv, "lease")});
      }
    }
    return range;
  } catch (const std::exception& e) {
    return fail(errc::protocol, std::string("etcd: a range answer that is not etcd's: ") + e.what());
  }
}

std::int64_t header_revision(const Json& answer) {
  try {
    return answer.contains("header") ? int64_field(answer["header"], "revision") : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

asio::awaitable<Result<RangeResult>> EtcdClient::range_prefix(const std::string& prefix) {
  const Json body = range_request(prefix);
  CORMA_CO_TRY(auto answer, co_await call("/v3/kv/range", body));
  co_return parse_range(answer, header_revision(answer));
}

asio::awaitable<Result<std::vector<RangeResult>>> EtcdClient::range_prefixes(const std::vector<std::string>& prefixes) {
  std::vector<RangeResult> ranges;
  ranges.reserve(prefixes.size());
  for (std::size_t first = 0; first < prefixes.size(); first += max_txn_ops) {
    const std::size_t end = std::min(prefixes.size(), first + max_txn_ops);
    Json reads = Json::array();
    for (std::size_t i = first; i < end; ++i) reads.push_back(Json{{"request_range", range_request(prefixes[i])}});
    const Json body{{"success", std::move(reads)}};
    CORMA_CO_TRY(auto answer, co_await call("/v3/kv/txn", body));
    const auto revision = header_revision(answer);
    const auto responses = answer.find("responses");
    if (responses == answer.end() || !responses->is_array() || responses->size() != end - first) {
      co_return fail(errc::protocol, "etcd: a transaction of " + std::to_string(end - first) +
                                         " ranges answered another number of responses");
    }
    for (const auto& response : *responses) {
      const auto range = response.find("response_range");
      if (range == response.end()) co_return fail(errc::protocol, "etcd: a range in a transaction answered no range");
      CORMA_CO_TRY(auto parsed, parse_range(*range, revision));
      ranges.push_back(std::move(parsed));
    }
  }
  co_return ranges;
}

}  // namespace corma::directory
