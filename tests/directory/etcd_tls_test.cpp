// corma::Directory against a real etcd that serves its clients over TLS
// only and asks each for a certificate (--client-cert-auth), with a CA this
// test makes: announcements, resolutions and the watch work over TLS with
// the right CA and client certificate; a client without a certificate, one
// trusting another CA, or one speaking plain HTTP reaches nothing and says
// why; files that cannot be loaded are refused as a configuration error.
#include "support/etcd_process.hpp"
#include "support/run.hpp"
#include "support/test_certificates.hpp"

#include <corma/directory.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gtest/gtest.h>

namespace {

namespace asio = boost::asio;
using corma::errc;

class DirectoryOverTls : public ::testing::Test {
 protected:
  asio::io_context io;
  corma::testing::TestCertificates pki;
  corma::testing::EtcdProcess etcd;

  void SetUp() override {
    if (auto missing = corma::testing::EtcdProcess::missing()) GTEST_SKIP() << *missing;
    if (auto missing = pki.missing()) GTEST_SKIP() << *missing;
    etcd.with_tls(pki.server_cert(), pki.server_key(), pki.ca());
    ASSERT_TRUE(etcd.start()) << "etcd said:\n" << etcd.output();
  }

  /// A config that reaches etcd: its CA, and a client certificate.
  corma::DirectoryConfig trusted(std::string machine = "host-c") const {
    auto config = corma::parse_directory_address("https://127.0.0.1:" + std::to_string(etcd.client_port())).value();
    config.key_prefix = "/tls";
    config.machine = std::move(machine);
    config.tls_ca_file = pki.ca();
    config.tls_cert_file = pki.client_cert();
    config.tls_key_file = pki.client_key();
    return config;
  }

  static corma::Announcement owner(std::string id, std::vector<std::string> names) {
    corma::Announcement a;
    a.owner = corma::OwnerEntry{std::move(id), "127.0.0.1", 4000, "host-o", "tcp", 3, 1};
    a.names = std::move(names);
    a.ttl = std::chrono::seconds(5);
    return a;
  }

  std::vector<std::string> resolve_ids(corma::Directory& directory, const std::string& name) {
    std::vector<std::string> ids;
    if (auto resolved = corma::testing::run(io, directory.async_resolve(name))) {
      for (const auto& o : resolved.value()) ids.push_back(o.id);
    }
    return ids;
  }
};

TEST_F(DirectoryOverTls, AnnouncementsResolutionsAndTheWatchWorkWithTheRightCaAndClientCertificate) {
  corma::Directory owner_side(io.get_executor(), trusted("host-o"));
  ASSERT_TRUE(corma::testing::run(io, owner_side.async_announce(owner("owner-a", {"obj"}))));

  auto watched = trusted();
  watched.cache_ttl = std::chrono::hours(1);  // only the watch can make the cache forget
  corma::Directory consumer(io.get_executor(), watched);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  // Resolved (the first resolution starts the watch) until the watch is live.
  while (!(resolve_ids(consumer, "obj") == std::vector<std::string>{"owner-a"} && consumer.stats().watching) &&
         std::chrono::steady_clock::now() < until) {
    asio::steady_timer pause(io, std::chrono::milliseconds(50));
    corma::testing::run(io, pause.async_wait(asio::use_awaitable));
  }
  ASSERT_TRUE(consumer.stats().watching) << "the watch never went live over TLS";
  ASSERT_EQ(resolve_ids(consumer, "obj"), std::vector<std::string>{"owner-a"});

  // A withdrawal reaches the consumer through the watch (its cache lives an
  // hour), so the watch's own TLS connection carries events.
  ASSERT_TRUE(corma::testing::run(io, owner_side.async_withdraw()));
  const auto withdrawn = std::chrono::steady_clock::now();
  while (!resolve_ids(consumer, "obj").empty() && std::chrono::steady_clock::now() - withdrawn < std::chrono::seconds(5)) {
    asio::steady_timer pause(io, std::chrono::milliseconds(20));
    corma::testing::run(io, pause.async_wait(asio::use_awaitable));
  }
  EXPECT_TRUE(resolve_ids(consumer, "obj").empty()) << "the watch did not report the withdrawal";
}

TEST_F(DirectoryOverTls, AClientWithoutACertificateOrTrustingAnotherCaOrSpeakingPlainHttpReachesNothing) {
  auto no_certificate = trusted();
  no_certificate.tls_cert_file.clear();
  no_certificate.tls_key_file.clear();
  auto wrong_ca = trusted();
  wrong_ca.tls_ca_file = pki.other_ca();
  auto plain = trusted();
  plain.tls = false;
  plain.tls_ca_file.clear();
  plain.tls_cert_file.clear();
  plain.tls_key_file.clear();
  for (const auto& [what, config] : {std::pair{"no client certificate", no_certificate},
                                     std::pair{"another CA", wrong_ca}, std::pair{"plain HTTP", plain}}) {
    corma::Directory directory(io.get_executor(), config);
    auto announced = corma::testing::run(io, directory.async_announce(owner("owner-x", {"obj"})));
    ASSERT_FALSE(announced) << what;
    EXPECT_TRUE(announced.error().is(errc::peer_unreachable) || announced.error().is(errc::protocol))
        << what << ": " << announced.error().message();
  }
  // Nothing they tried reached etcd.
  corma::Directory checker(io.get_executor(), trusted());
  EXPECT_TRUE(resolve_ids(checker, "obj").empty());
}

TEST_F(DirectoryOverTls, ACaCertificateOrKeyThatCannotBeLoadedIsAConfigurationError) {
  const std::string nowhere = pki.file("no-such-file.pem");
  auto bad_ca = trusted();
  bad_ca.tls_ca_file = nowhere;
  auto bad_cert = trusted();
  bad_cert.tls_cert_file = nowhere;
  auto key_without_cert = trusted();
  key_without_cert.tls_cert_file.clear();
  auto not_a_key = trusted();
  not_a_key.tls_key_file = pki.ca();  // a certificate where the key should be
  for (const auto& [what, config] : {std::pair{"missing CA", bad_ca}, std::pair{"missing certificate", bad_cert},
                                     std::pair{"a key without its certificate", key_without_cert},
                                     std::pair{"a certificate for a key", not_a_key}}) {
    corma::Directory directory(io.get_executor(), config);
    auto resolved = corma::testing::run(io, directory.async_resolve("obj"));
    ASSERT_FALSE(resolved) << what;
    EXPECT_TRUE(resolved.error().is(errc::not_configured)) << what << ": " << resolved.error().message();
  }
}

}  // namespace
