// An owner's announcement against etcd answers in orders a real etcd cannot
// be made to give (tests/directory/fake_etcd.hpp): a withdrawal while a
// renewal waits for its keep-alive is not undone when that answer comes,
// and a lease whose writes failed is revoked, never renewed with names
// missing under it, and the next renewal writes everything again. Renewals
// come a third of the ttl apart.
#include "directory/fake_etcd.hpp"
#include "support/run.hpp"

#include <corma/directory.hpp>

#include <gtest/gtest.h>

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using corma::testing::FakeEtcd;

corma::DirectoryConfig config_for(const FakeEtcd& etcd) {
  corma::DirectoryConfig config;
  config.port = etcd.port();
  config.key_prefix = "/race";
  config.watch = false;
  return config;
}

corma::Announcement announcement() {
  corma::Announcement a;
  a.owner = corma::OwnerEntry{"owner-a", "127.0.0.1", 4000, "host-o", "tcp", 6, 1};
  a.names = {"obj"};
  a.ttl = std::chrono::seconds(1);  // renewed every third of a second
  return a;
}

FakeEtcd::Answer lease(const std::string& id, const char* ttl) {
  return FakeEtcd::Answer{http::status::ok, {{"ID", id}, {"TTL", ttl}}};
}

FakeEtcd::Answer kept_alive(const std::string& id, const char* ttl) {
  return FakeEtcd::Answer{http::status::ok, {{"result", {{"ID", id}, {"TTL", ttl}}}}};
}

std::string lease_of(const FakeEtcd::Call& call) { return call.body.value("ID", std::string()); }

TEST(AnnouncementRaces, AWithdrawalWhileARenewalWaitsForItsKeepAliveIsNotUndoneWhenTheAnswerComes) {
  asio::io_context io;
  FakeEtcd etcd(io, [&](const FakeEtcd::Call& call, std::size_t) -> std::optional<FakeEtcd::Answer> {
    if (call.path == "/v3/lease/grant") return lease("7", "1");
    if (call.path == "/v3/lease/keepalive") {
      io.stop();  // back to the test, which withdraws while etcd holds this
      return std::nullopt;
    }
    return FakeEtcd::Answer{};  // the writes and the revocation
  });
  corma::Directory owner(io.get_executor(), config_for(etcd));
  ASSERT_TRUE(corma::testing::run(io, owner.async_announce(announcement())));
  const auto announced = std::chrono::steady_clock::now();
  io.restart();
  io.run_for(std::chrono::seconds(5));
  ASSERT_TRUE(etcd.holding()) << "no renewal asked etcd to keep the lease alive";
  // A third of the 1 s ttl (once rounded to nothing in whole seconds).
  EXPECT_GE(std::chrono::steady_clock::now() - announced, std::chrono::milliseconds(330));

  ASSERT_TRUE(corma::testing::run(io, owner.async_withdraw()));
  // etcd answers the keep-alive only now, as it would for the lease just
  // revoked: gone. The renewal must not take that as a lease to grant again.
  etcd.release(kept_alive("7", "0"));
  etcd.close();
  io.restart();
  io.run_for(std::chrono::seconds(5));  // returns once nothing is left to run
  EXPECT_TRUE(io.stopped()) << "the renewal goes on after the withdrawal";
  EXPECT_EQ(etcd.paths(),
            (std::vector<std::string>{"/v3/lease/grant", "/v3/kv/txn", "/v3/lease/keepalive", "/v3/lease/revoke"}))
      << "the withdrawn owner was announced again";
  EXPECT_FALSE(owner.stats().announced);
}

TEST(AnnouncementRaces, ALeaseWhoseWritesFailedIsRevokedNeverRenewedAndTheNextRenewalWritesEverythingAgain) {
  asio::io_context io;
  int grants = 0;
  int writes = 0;
  FakeEtcd etcd(io, [&](const FakeEtcd::Call& call, std::size_t) -> std::optional<FakeEtcd::Answer> {
    if (call.path == "/v3/lease/grant") return lease(std::to_string(++grants), "1");
    if (call.path == "/v3/kv/txn" && ++writes == 2) {
      return FakeEtcd::Answer{http::status::internal_server_error, {{"message", "injected: the write failed"}}};
    }
    if (call.path == "/v3/lease/keepalive") {
      // etcd lost the first lease; the third is the one to keep.
      if (lease_of(call) == "3") io.stop();
      return kept_alive(lease_of(call), lease_of(call) == "1" ? "0" : "1");
    }
    return FakeEtcd::Answer{};
  });
  corma::Directory owner(io.get_executor(), config_for(etcd));
  ASSERT_TRUE(corma::testing::run(io, owner.async_announce(announcement())));
  io.restart();
  io.run_for(std::chrono::seconds(10));
  ASSERT_GE(etcd.calls().size(), 9u) << "the announcement never came back";
  EXPECT_EQ(etcd.paths(), (std::vector<std::string>{"/v3/lease/grant", "/v3/kv/txn", "/v3/lease/keepalive",
                                                    "/v3/lease/grant", "/v3/kv/txn", "/v3/lease/revoke",
                                                    "/v3/lease/grant", "/v3/kv/txn", "/v3/lease/keepalive"}));
  EXPECT_EQ(lease_of(etcd.calls()[5]), "2") << "the lease whose writes failed was not the one revoked";
  for (const auto& call : etcd.calls()) {
    EXPECT_FALSE(call.path == "/v3/lease/keepalive" && lease_of(call) == "2")
        << "a lease with names missing under it was renewed";
  }
  // The last writes put every key under the third lease.
  const auto& rewritten = etcd.calls()[7].body;
  ASSERT_TRUE(rewritten.contains("success"));
  EXPECT_EQ(rewritten["success"].size(), 2u) << "the owner's entry and its one name";
  for (const auto& put : rewritten["success"]) EXPECT_EQ(put["request_put"].value("lease", std::string()), "3");
  EXPECT_TRUE(owner.stats().announced);
}

}  // namespace
