// One connection to an etcd member, over plain TCP or over TLS, and what a
// client needs to reach the members at all (their addresses, the
// credentials, the TLS context). Every call and the watch go through it, so
// that both speak TLS the same way: the member's certificate must chain to
// the configured CA and name the member's IP address; a client certificate,
// when configured, is shown to etcd (its --client-cert-auth).
#pragma once

#include <corma/directory.hpp>
#include <corma/error.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace corma::directory {

/// etcd's user and password; an empty user: authentication is off.
struct EtcdCredentials {
  std::string user;
  std::string password;
};

/// Where etcd is and how to speak to it.
struct EtcdAccess {
  std::vector<EtcdMember> members;  ///< the first one first
  EtcdCredentials credentials;
  /// TLS to every member; none: plain TCP.
  std::shared_ptr<boost::asio::ssl::context> tls;
  /// Why etcd cannot be reached as configured (a CA, certificate or key
  /// that cannot be loaded): every connection fails with it.
  std::optional<Error> unusable;
};

/// The access a config describes (its TLS files loaded now).
[[nodiscard]] EtcdAccess access_of(const DirectoryConfig& config);

class EtcdStream {
 public:
  using Plain = boost::beast::tcp_stream;
  using Tls = boost::beast::ssl_stream<boost::beast::tcp_stream>;

  /// Connects to `member` (and, with TLS, completes the handshake) within
  /// `timeout`: `peer_unreachable` when it cannot, `not_configured` when
  /// the access is unusable or the member is not an IP address.
  static boost::asio::awaitable<Result<EtcdStream>> connect(boost::asio::any_io_executor executor,
                                                           const EtcdAccess& access, const EtcdMember& member,
                                                           std::chrono::milliseconds timeout);

  /// `operation(stream)` on whichever stream this is (Beast's HTTP
  /// operations take either): what it returns, to co_await.
  template <class Operation>
  auto visit(Operation&& operation) {
    if (auto* tls = std::get_if<Tls>(&stream_)) return operation(*tls);
    return operation(std::get<Plain>(stream_));
  }

  /// The TCP stream beneath: deadlines, socket options, closing.
  [[nodiscard]] Plain& tcp() noexcept;

 private:
  explicit EtcdStream(Plain plain) : stream_(std::move(plain)) {}
  explicit EtcdStream(Tls tls) : stream_(std::move(tls)) {}

  std::variant<Plain, Tls> stream_;
};

}  // namespace corma::directory
