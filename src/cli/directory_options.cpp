#include "directory_options.hpp"

#include "listing_text.hpp"

#include <corma/rendezvous.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace corma::cli {

namespace asio = boost::asio;

Result<DirectoryConfig> directory_config(const DirectoryOptions& options) {
  CORMA_TRY(auto config, parse_directory_address(options.address));
  config.key_prefix = options.key_prefix;
  config.user = options.user;
  if (!options.password_file.empty()) {
    if (options.user.empty()) return fail(errc::out_of_range, "--directory-password-file needs --directory-user");
    std::ifstream file(options.password_file);
    if (!file || !std::getline(file, config.password)) {
      return fail(errc::not_configured, "cannot read the password in " + options.password_file);
    }
  }
  if (options.cert.empty() != options.key.empty()) {
    return fail(errc::out_of_range, "--directory-cert and --directory-key go together");
  }
  config.tls_ca_file = options.cacert;
  config.tls_cert_file = options.cert;
  config.tls_key_file = options.key;
  config.tls = config.tls || !options.cacert.empty() || !options.cert.empty() || !options.key.empty();
  return config;
}

namespace {

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  return host;
}

}  // namespace

std::string serve_owner_id(const ServeOptions& options, std::uint16_t port) {
  return options.owner_id.empty() ? host_name() + "-" + std::to_string(port) : options.owner_id;
}

Announcement serve_announcement(const ServeOptions& options, const asio::ip::tcp::endpoint& bound, bool rdma) {
  const auto host = host_name();
  Announcement a;
  a.owner.id = serve_owner_id(options, bound.port());
  a.owner.host = bound.address().to_string();
  a.owner.port = bound.port();
  a.owner.machine = host;
  a.owner.transport = rdma ? options.transport.transport : "none";
  a.owner.protocol_version = rendezvous_protocol_version;
  // Every file by prefix unless the files are announced by name.
  a.prefixes = options.announce.empty() && !options.announce_files ? std::vector<std::string>{""} : options.announce;
  a.ttl = std::chrono::seconds(std::max<long>(1, static_cast<long>(options.announce_ttl_s)));
  return a;
}

int run_list(const ListOptions& options) {
  auto config = directory_config(options.directory);
  if (!config) {
    std::fprintf(stderr, "corma ls: %s\n", config.error().message().c_str());
    return 2;
  }
  asio::io_context io(1);
  Directory directory(io.get_executor(), config.value());
  auto listed = directory.async_list(options.prefix, asio::use_future);
  io.run();
  auto listing = listed.get();
  if (!listing) {
    std::fprintf(stderr, "corma ls: %s\n", listing.error().message().c_str());
    return 1;
  }
  // An owner consumers skip is listed with the reason, so that a cluster's
  // operator sees what its consumers do not.
  // Every field is escaped: etcd's writers choose these bytes.
  // The version an owner announced for a name follows the owner's id.
  for (const auto& entry : listing.value()) {
    const auto name = escaped_for_listing(entry.name);
    auto owner = escaped_for_listing(entry.owner);
    if (entry.version) owner += "\tversion " + std::to_string(*entry.version);
    if (entry.unusable.empty()) {
      std::printf("%s\t%s\n", name.c_str(), owner.c_str());
    } else {
      std::printf("%s\t%s\tskipped by consumers: %s\n", name.c_str(), owner.c_str(),
                  escaped_for_listing(entry.unusable).c_str());
    }
  }
  return 0;
}

}  // namespace corma::cli
