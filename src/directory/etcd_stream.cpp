#include "etcd_stream.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma::directory {

namespace asio = boost::asio;
namespace ssl = asio::ssl;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

Error unloadable(const std::string& what, const std::string& file, const boost::system::error_code& ec) {
  return Error{errc::not_configured, "etcd TLS: cannot load the " + what + " '" + file + "': " + ec.message()};
}

/// A client context that verifies etcd's certificate, and shows one of its
/// own if the config names it.
Result<std::shared_ptr<ssl::context>> tls_context_of(const DirectoryConfig& config) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_client);
  boost::system::error_code ec;
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                           ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1,
                       ec);
  context->set_verify_mode(ssl::verify_peer, ec);
  if (config.tls_ca_file.empty()) {
    context->set_default_verify_paths(ec);
    if (ec) return Error{errc::not_configured, "etcd TLS: the system's trusted CAs: " + ec.message()};
  } else if (context->load_verify_file(config.tls_ca_file, ec); ec) {
    return unloadable("CA", config.tls_ca_file, ec);
  }
  if (config.tls_cert_file.empty() != config.tls_key_file.empty()) {
    return fail(errc::not_configured, "etcd TLS: a client certificate goes with its key, and a key with its certificate");
  }
  if (!config.tls_cert_file.empty()) {
    if (context->use_certificate_chain_file(config.tls_cert_file, ec); ec) {
      return unloadable("certificate", config.tls_cert_file, ec);
    }
    if (context->use_private_key_file(config.tls_key_file, ssl::context::pem, ec); ec) {
      return unloadable("key", config.tls_key_file, ec);
    }
  }
  return context;
}

}  // namespace

EtcdAccess access_of(const DirectoryConfig& config) {
  EtcdAccess access;
  access.members.push_back(EtcdMember{config.host, config.port});
  access.members.insert(access.members.end(), config.other_members.begin(), config.other_members.end());
  access.credentials = EtcdCredentials{config.user, config.password};
  const bool tls =
      config.tls || !config.tls_ca_file.empty() || !config.tls_cert_file.empty() || !config.tls_key_file.empty();
  if (tls) {
    auto context = tls_context_of(config);
    if (context) {
      access.tls = std::move(context).value();
    } else {
      access.unusable = context.error();
    }
  }
  return access;
}

EtcdStream::Plain& EtcdStream::tcp() noexcept {
  if (auto* tls = std::get_if<Tls>(&stream_)) return tls->next_layer();
  return std::get<Plain>(stream_);
}

asio::awaitable<Result<EtcdStream>> EtcdStream::connect(asio::any_io_executor executor, const EtcdAccess& access,
                                                        const EtcdMember& member, std::chrono::milliseconds timeout) {
  if (access.unusable) co_return *access.unusable;
  const auto where = member.host + ":" + std::to_string(member.port);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(member.host, ec);
  if (ec) co_return fail(errc::not_configured, "etcd: '" + member.host + "' is not an IP address");
  Plain plain(std::move(executor));
  plain.expires_after(timeout);
  if (auto [connected] = co_await plain.async_connect(asio::ip::tcp::endpoint(address, member.port), as_result);
      connected) {
    co_return Error{errc::peer_unreachable, "etcd: connect to " + where + ": " + connected.message()};
  }
  if (!access.tls) co_return EtcdStream(std::move(plain));
  Tls tls(std::move(plain), *access.tls);
  // The certificate must name the address dialled (an IP SAN).
  tls.set_verify_callback(ssl::host_name_verification(member.host));
  if (auto [handshake] = co_await tls.async_handshake(ssl::stream_base::client, as_result); handshake) {
    co_return Error{errc::peer_unreachable, "etcd: TLS with " + where + ": " + handshake.message()};
  }
  co_return EtcdStream(std::move(tls));
}

}  // namespace corma::directory
