// etcd's v3 API through its JSON gateway (etcd 3.4: POST /v3/kv/range,
// /v3/kv/put, /v3/kv/deleterange, /v3/lease/grant, /v3/lease/keepalive,
// /v3/lease/revoke), over HTTP/1.1 with Boost.Beast. Keys and values travel
// base64-encoded, 64-bit numbers as decimal strings, as the gateway's JSON
// mapping of etcd's protobuf messages has them. Connections are kept open
// between calls and reused; a call that fails for any reason drops its
// connection. Every call has a deadline.
#pragma once

#include <corma/directory.hpp>
#include <corma/error.hpp>

#include "etcd_stream.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace corma::directory {

using Json = nlohmann::json;

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t lease = 0;
};

/// What a prefix holds, and the store's revision when it was read.
struct RangeResult {
  std::vector<KeyValue> kvs;
  std::int64_t revision = 0;
};

/// The body of an authenticate call for `credentials`, and the token in
/// its answer (`not_owned` when etcd refused them).
[[nodiscard]] Json authenticate_body(const EtcdCredentials& credentials);
[[nodiscard]] Result<std::string> token_from(const Json& answer);

class EtcdClient {
 public:
  /// Calls go to one member until it cannot be reached, then to the next.
  /// With a user, each call carries a token etcd gave for the credentials.
  EtcdClient(boost::asio::any_io_executor executor, EtcdAccess access, std::chrono::milliseconds timeout);
  /// One member, over plain TCP, without authentication.
  EtcdClient(boost::asio::any_io_executor executor, std::string host, std::uint16_t port,
             std::chrono::milliseconds timeout);

  /// POSTs `body` to `path` and returns the JSON answer; `backend` when
  /// etcd answers an error, `peer_unreachable` when no member can be
  /// reached or the call times out at each. A call that failed at one
  /// member is made again at the next: a put or a revoke is the same done
  /// twice; a lease granted twice leaves one to lapse unrenewed.
  boost::asio::awaitable<Result<Json>> call(const char* path, const Json& body);

  /// The member calls go to now.
  [[nodiscard]] const EtcdMember& current_member() const { return member(); }

  /// Requests made so far (one per round trip, retries included).
  [[nodiscard]] std::uint64_t calls() const noexcept { return calls_; }

  /// A lease of `ttl`, its id.
  boost::asio::awaitable<Result<std::int64_t>> grant_lease(std::chrono::seconds ttl);
  /// Refreshes a lease; `region_not_found` when etcd no longer has it.
  boost::asio::awaitable<Result<void>> keep_alive(std::int64_t lease);
  boost::asio::awaitable<Result<void>> revoke(std::int64_t lease);
  boost::asio::awaitable<Result<void>> put(const std::string& key, const std::string& value, std::int64_t lease);
  /// Many puts under one lease, in transactions of at most 128 (etcd's
  /// default --max-txn-ops).
  boost::asio::awaitable<Result<void>> put_all(const std::vector<KeyValue>& kvs, std::int64_t lease);
  /// Deletes each of `keys` (one key each, not a range), in transactions
  /// of at most 128; a key that is not there is no error.
  boost::asio::awaitable<Result<void>> delete_all(const std::vector<std::string>& keys);
  /// Every key starting with `prefix`.
  boost::asio::awaitable<Result<RangeResult>> range_prefix(const std::string& prefix);
  /// Every key under each of `prefixes`, answered in their order: ranges in
  /// transactions of at most 128, each transaction one consistent read.
  boost::asio::awaitable<Result<std::vector<RangeResult>>> range_prefixes(const std::vector<std::string>& prefixes);

 private:
  boost::asio::awaitable<Result<EtcdStream>> connection();
  boost::asio::awaitable<Result<Json>> call_once(const char* path, const Json& body);
  /// call_once with the token, asked for first if there is none, and once
  /// more if etcd no longer takes it.
  boost::asio::awaitable<Result<Json>> call_authenticated(const char* path, const Json& body);

  /// The member calls go to; the next one after it cannot be reached.
  [[nodiscard]] const EtcdMember& member() const { return access_.members[current_]; }

  boost::asio::any_io_executor executor_;
  EtcdAccess access_;
  std::size_t current_ = 0;
  std::chrono::milliseconds timeout_;
  std::string token_;
  std::vector<EtcdStream> idle_;  ///< open connections, waiting for a call
  std::uint64_t calls_ = 0;
};

/// At most this many operations in one transaction (etcd's default
/// --max-txn-ops).
inline constexpr std::size_t max_txn_ops = 128;

/// The first key after every key starting with `prefix` (etcd's range_end
/// for a prefix).
[[nodiscard]] std::string prefix_end(std::string prefix);

/// A POST of `body` to `path` of etcd's gateway at `host`, as every call
/// (and the watch) sends it, with etcd's auth `token` if there is one.
[[nodiscard]] boost::beast::http::request<boost::beast::http::string_body> json_post(
    const std::string& host, const char* path, const Json& body, const std::string& token = {});

[[nodiscard]] std::string to_base64(std::string_view bytes);
[[nodiscard]] Result<std::string> from_base64(std::string_view text);

}  // namespace corma::directory
