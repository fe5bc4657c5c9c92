// corma::Directory against a real etcd: owners announce names and prefixes
// under leases, consumers resolve them in the documented order; a
// withdrawal removes an owner at once and a dead owner's entries go with its
// lease; a lease etcd lost is granted again and the announcement restored;
// while etcd is down, resolutions come from the cache and say so.
#include "directory/etcd_server.hpp"
#include "support/run.hpp"

#include <corma/directory.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gtest/gtest.h>

#include <array>
#include <map>

#include <optional>

#include "directory/etcd_client.hpp"
#include "directory/key_watch.hpp"
#include "directory/records.hpp"

namespace {

namespace asio = boost::asio;
using corma::errc;

class DirectoryTest : public ::testing::Test {
 protected:
  asio::io_context io;
  corma::testing::EtcdServer etcd;

  void SetUp() override {
    if (auto missing = corma::testing::EtcdServer::missing()) GTEST_SKIP() << *missing;
    ASSERT_TRUE(etcd.start()) << "etcd did not start";
  }

  corma::DirectoryConfig config(std::string machine = "consumer-host") {
    auto c = etcd.config("/test");
    c.machine = std::move(machine);
    c.cache_ttl = std::chrono::milliseconds(0);  // every resolution asks etcd
    return c;
  }

  static corma::Announcement owner(std::string id, std::string machine, std::uint64_t load,
                                   std::vector<std::string> names, std::vector<std::string> prefixes = {}) {
    corma::Announcement a;
    a.owner = corma::OwnerEntry{id, "127.0.0.1", 4000, std::move(machine), "tcp", 3, load};
    a.names = std::move(names);
    a.prefixes = std::move(prefixes);
    a.ttl = std::chrono::seconds(2);
    return a;
  }

  std::vector<std::string> resolve_ids(corma::Directory& directory, const std::string& name) {
    auto resolved = corma::testing::run(io, directory.async_resolve(name));
    std::vector<std::string> ids;
    if (resolved) {
      for (const auto& o : resolved.value()) ids.push_back(o.id);
    }
    return ids;
  }

  /// Resolves `name` until `done(ids)` holds or `limit` passes (etcd's
  /// lease expiry has no event to wait on).
  template <class Done>
  bool resolves_eventually(corma::Directory& directory, const std::string& name, Done done,
                           std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (done(resolve_ids(directory, name))) return true;
      asio::steady_timer pause(io, std::chrono::milliseconds(100));
      corma::testing::run(io, pause.async_wait(asio::use_awaitable));
    }
    return false;
  }
};

TEST_F(DirectoryTest, NamesResolveToTheirOwnersSameMachineThenLeastLoaded) {
  corma::Directory a(io.get_executor(), config("host-a"));
  corma::Directory b(io.get_executor(), config("host-b"));
  corma::Directory c(io.get_executor(), config("host-c"));
  ASSERT_TRUE(corma::testing::run(io, a.async_announce(owner("owner-a", "host-a", 5, {"model/layer-1", "x"}))));
  ASSERT_TRUE(corma::testing::run(io, b.async_announce(owner("owner-b", "host-b", 1, {"model/layer-1"}))));
  ASSERT_TRUE(corma::testing::run(io, c.async_announce(owner("owner-c", "host-c", 9, {}, {"kv/"}))));

  corma::Directory on_host_a(io.get_executor(), config("host-a"));
  corma::Directory elsewhere(io.get_executor(), config("host-z"));
  EXPECT_EQ(resolve_ids(on_host_a, "model/layer-1"), (std::vector<std::string>{"owner-a", "owner-b"}))
      << "the owner on the same machine comes first";
  EXPECT_EQ(resolve_ids(elsewhere, "model/layer-1"), (std::vector<std::string>{"owner-b", "owner-a"}))
      << "then the least loaded";
  EXPECT_EQ(resolve_ids(elsewhere, "kv/block-7"), (std::vector<std::string>{"owner-c"})) << "by its prefix";
  EXPECT_EQ(resolve_ids(elsewhere, "x"), (std::vector<std::string>{"owner-a"}));
  auto nobody = corma::testing::run(io, elsewhere.async_resolve("model/layer-10"));
  ASSERT_FALSE(nobody) << "a longer name is another name";
  EXPECT_TRUE(nobody.error().is(errc::region_not_found));

  auto resolved = corma::testing::run(io, elsewhere.async_resolve("x")).value();
  EXPECT_EQ(resolved.front().port, 4000);
  EXPECT_EQ(resolved.front().transport, "tcp");
  EXPECT_EQ(resolved.front().protocol_version, 3);

  auto listed = corma::testing::run(io, elsewhere.async_list("model/")).value();
  EXPECT_EQ(listed.size(), 2u);
}

TEST_F(DirectoryTest, AWithdrawnOwnerVanishesAtOnceAndADeadOnesEntriesGoWithItsLease) {
  corma::Directory consumer(io.get_executor(), config());
  corma::Directory withdrawing(io.get_executor(), config("host-a"));
  ASSERT_TRUE(corma::testing::run(io, withdrawing.async_announce(owner("owner-a", "host-a", 0, {"obj"}))));
  auto dying = std::make_unique<corma::Directory>(io.get_executor(), config("host-b"));
  ASSERT_TRUE(corma::testing::run(io, dying->async_announce(owner("owner-b", "host-b", 0, {"obj"}))));
  EXPECT_EQ(resolve_ids(consumer, "obj").size(), 2u);

  ASSERT_TRUE(corma::testing::run(io, withdrawing.async_withdraw()));
  EXPECT_EQ(resolve_ids(consumer, "obj"), (std::vector<std::string>{"owner-b"})) << "withdrawn: gone at once";

  dying.reset();  // stops renewing, as a killed owner would
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(resolves_eventually(consumer, "obj", [](const auto& ids) { return ids.empty(); }, std::chrono::seconds(8)))
      << "a dead owner's entries outlived its lease";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "the lease's ttl is 2 s";
}

TEST_F(DirectoryTest, ALeaseEtcdLostIsGrantedAgainAndTheAnnouncementRestored) {
  corma::Directory announcing(io.get_executor(), config("host-a"));
  ASSERT_TRUE(corma::testing::run(io, announcing.async_announce(owner("owner-a", "host-a", 0, {"obj"}))));
  // Someone else revokes every lease, as etcd does with leases it lost.
  corma::directory::EtcdClient admin(io.get_executor(), "127.0.0.1", etcd.config("").port, std::chrono::seconds(2));
  auto leases = corma::testing::run(io, admin.call("/v3/lease/leases", corma::directory::Json::object())).value();
  ASSERT_TRUE(leases.contains("leases"));
  for (const auto& lease : leases["leases"]) {
    ASSERT_TRUE(corma::testing::run(io, admin.revoke(std::stoll(lease["ID"].get<std::string>()))));
  }
  corma::Directory consumer(io.get_executor(), config());
  EXPECT_TRUE(resolve_ids(consumer, "obj").empty()) << "the revocation took the entries";
  EXPECT_TRUE(resolves_eventually(
      consumer, "obj", [](const auto& ids) { return ids == std::vector<std::string>{"owner-a"}; }, std::chrono::seconds(5)))
      << "the announcement was not restored";
  EXPECT_EQ(announcing.stats().leases_granted, 2u);
}

TEST_F(DirectoryTest, WithEtcdsAuthenticationOnlyTheRightCredentialsAnnounceResolveAndWatch) {
  corma::directory::EtcdClient admin(io.get_executor(), "127.0.0.1", etcd.config("").port, std::chrono::seconds(2));
  const corma::directory::Json user{{"name", "root"}, {"password", "s3cret"}};
  const corma::directory::Json grant{{"user", "root"}, {"role", "root"}};
  ASSERT_TRUE(corma::testing::run(io, admin.call("/v3/auth/user/add", user)));
  ASSERT_TRUE(corma::testing::run(io, admin.call("/v3/auth/user/grant", grant)));
  ASSERT_TRUE(corma::testing::run(io, admin.call("/v3/auth/enable", corma::directory::Json::object())));

  corma::Directory anonymous(io.get_executor(), config());
  EXPECT_FALSE(corma::testing::run(io, anonymous.async_announce(owner("owner-x", "m", 0, {"obj"}))))
      << "announced without credentials";
  auto wrong_config = config();
  wrong_config.user = "root";
  wrong_config.password = "guess";
  corma::Directory wrong(io.get_executor(), wrong_config);
  auto refused = corma::testing::run(io, wrong.async_announce(owner("owner-x", "m", 0, {"obj"})));
  ASSERT_FALSE(refused) << "announced with a wrong password";
  EXPECT_TRUE(refused.error().is(errc::not_owned)) << refused.error().message();

  auto right_config = config();
  right_config.user = "root";
  right_config.password = "s3cret";
  corma::Directory announcing(io.get_executor(), right_config);
  ASSERT_TRUE(corma::testing::run(io, announcing.async_announce(owner("owner-a", "host-a", 0, {"obj"}))));
  auto watched_config = right_config;
  watched_config.cache_ttl = std::chrono::hours(1);  // only the watch can tell it of the withdrawal
  corma::Directory consumer(io.get_executor(), watched_config);
  EXPECT_TRUE(resolves_eventually(
      consumer, "obj", [&](const auto& ids) { return ids == std::vector<std::string>{"owner-a"} && consumer.stats().watching; },
      std::chrono::seconds(5)))
      << "not resolved, or the watch never went live";
  ASSERT_TRUE(corma::testing::run(io, announcing.async_withdraw()));
  EXPECT_TRUE(resolves_eventually(
      consumer, "obj", [](const auto& ids) { return ids.empty(); }, std::chrono::seconds(5)))
      << "the watch did not report the withdrawal";
  EXPECT_TRUE(resolve_ids(anonymous, "obj").empty());
}

TEST_F(DirectoryTest, TheWatchDropsAWithdrawnOwnerFromTheCacheAtOnce) {
  auto watched = config();
  watched.cache_ttl = std::chrono::hours(1);  // only the watch can make the cache forget
  corma::Directory consumer(io.get_executor(), watched);
  corma::Directory a(io.get_executor(), config("host-a"));
  corma::Directory b(io.get_executor(), config("host-b"));
  ASSERT_TRUE(corma::testing::run(io, a.async_announce(owner("owner-a", "host-a", 0, {"obj"}))));
  ASSERT_TRUE(corma::testing::run(io, b.async_announce(owner("owner-b", "host-b", 1, {"obj"}))));
  // Resolved until the watch is live and the answer cached under it.
  ASSERT_TRUE(resolves_eventually(
      consumer, "obj", [&](const auto& ids) { return ids.size() == 2 && consumer.stats().watching; },
      std::chrono::seconds(5)));
  ASSERT_TRUE(resolves_eventually(
      consumer, "obj", [&](const auto&) { return consumer.stats().cache_hits >= 3; }, std::chrono::seconds(5)))
      << "the answer is not served from the cache";
  ASSERT_TRUE(corma::testing::run(io, a.async_withdraw()));
  const auto withdrawn = std::chrono::steady_clock::now();
  EXPECT_TRUE(resolves_eventually(
      consumer, "obj", [](const auto& ids) { return ids == std::vector<std::string>{"owner-b"}; },
      std::chrono::seconds(5)));
  EXPECT_LT(std::chrono::steady_clock::now() - withdrawn, std::chrono::seconds(1))
      << "the cache kept a withdrawn owner";
}

TEST_F(DirectoryTest, ALostWatchIsReestablishedAndWhatWasCachedIsCheckedAgain) {
  auto watched = config();
  watched.cache_ttl = std::chrono::hours(1);
  corma::Directory consumer(io.get_executor(), watched);
  // The first resolution starts the watch; once it is live, what is read
  // is read under it (an answer read before would live its cache_ttl).
  ASSERT_TRUE(resolves_eventually(
      consumer, "obj", [&](const auto&) { return consumer.stats().watching; }, std::chrono::seconds(5)));
  {
    corma::Directory a(io.get_executor(), config("host-a"));
    ASSERT_TRUE(corma::testing::run(io, a.async_announce(owner("owner-a", "host-a", 0, {"obj"}))));
    ASSERT_TRUE(resolves_eventually(
        consumer, "obj", [&](const auto& ids) { return ids.size() == 1; }, std::chrono::seconds(5)));
    EXPECT_TRUE(consumer.stats().watching);
    etcd.stop();
    // The watch broke (noticed as its connection closes): what it vouched
    // for is no longer trusted, but is all there is while etcd is down.
    EXPECT_TRUE(resolves_eventually(
        consumer, "obj", [&](const auto&) { return !consumer.stats().watching; }, std::chrono::seconds(5)));
    EXPECT_EQ(resolve_ids(consumer, "obj"), (std::vector<std::string>{"owner-a"}));
    EXPECT_GE(consumer.stats().stale_resolutions, 1u);
    ASSERT_TRUE(etcd.start()) << "etcd did not start again";
    ASSERT_TRUE(corma::testing::run(io, a.async_withdraw()));
  }
  EXPECT_TRUE(resolves_eventually(consumer, "obj", [](const auto& ids) { return ids.empty(); }, std::chrono::seconds(5)))
      << "a deletion made while the watch was down was never seen";
}

TEST_F(DirectoryTest, AChangedLoadFigureIsAnnouncedAtTheNextRenewal) {
  std::uint64_t load = 3;
  auto announcement = owner("owner-a", "host-a", 0, {"obj"});
  announcement.current_load = [&load] { return load; };
  corma::Directory announcing(io.get_executor(), config("host-a"));
  ASSERT_TRUE(corma::testing::run(io, announcing.async_announce(announcement)));
  auto announced_load = [&](corma::Directory& consumer) -> std::optional<std::uint64_t> {
    auto resolved = corma::testing::run(io, consumer.async_resolve("obj"));
    if (!resolved || resolved.value().size() != 1) return std::nullopt;
    return resolved.value().front().load;
  };
  corma::Directory first(io.get_executor(), config());
  EXPECT_EQ(announced_load(first), 3u) << "the figure at the time of announcing";
  // Once the watch is live and what it needs is read under it, the change
  // itself comes through the watch: no read of etcd for it.
  ASSERT_TRUE(resolves_eventually(
      first, "obj", [&](const auto&) { return first.stats().watching; }, std::chrono::seconds(5)));
  EXPECT_EQ(announced_load(first), 3u);
  const auto reads = first.stats().etcd_requests;
  const auto leases = announcing.stats().leases_granted;
  load = 11;
  EXPECT_TRUE(resolves_eventually(
      first, "obj", [&](const auto&) { return announced_load(first) == std::optional<std::uint64_t>(11); },
      std::chrono::seconds(5)))
      << "a consumer (its watch saw the entry change) ranks by the new figure";
  EXPECT_EQ(first.stats().etcd_requests, reads) << "the owners' family was dropped and read again, not updated";
  EXPECT_EQ(announcing.stats().leases_granted, leases) << "under the same lease";
  EXPECT_EQ(announcing.stats().etcd_failures, 0u);
}

TEST_F(DirectoryTest, WhileEtcdIsDownResolutionsComeFromTheCacheAndSaySo) {
  corma::Directory announcing(io.get_executor(), config("host-a"));
  ASSERT_TRUE(corma::testing::run(io, announcing.async_announce(owner("owner-a", "host-a", 0, {"cached"}))));
  corma::Directory consumer(io.get_executor(), config());
  EXPECT_EQ(resolve_ids(consumer, "cached"), (std::vector<std::string>{"owner-a"}));
  etcd.stop();
  EXPECT_EQ(resolve_ids(consumer, "cached"), (std::vector<std::string>{"owner-a"})) << "answered from the cache";
  EXPECT_EQ(consumer.stats().stale_resolutions, 1u);
  auto never_seen = corma::testing::run(io, consumer.async_resolve("never-seen"));
  ASSERT_FALSE(never_seen);
  EXPECT_TRUE(never_seen.error().is(errc::peer_unreachable)) << never_seen.error().message();
}

TEST_F(DirectoryTest, EntriesNoConsumerCouldUseAreSkippedCountedAndReportedOncePerOwner) {
  corma::Directory announcing(io.get_executor(), config("host-b"));
  ASSERT_TRUE(corma::testing::run(io, announcing.async_announce(owner("owner-good", "host-b", 5, {"obj"}))));
  // Someone with write access to etcd announces owners under the empty
  // prefix, with loads and hosts made to win the ranking.
  auto c = config();
  corma::directory::EtcdClient writer(io.get_executor(), "127.0.0.1", c.port, std::chrono::seconds(2));
  const std::vector<std::pair<std::string, std::string>> evil = {
      {"evil-host", R"({"host": "not-an-ip", "port": 7000, "machine": "consumer-host", "transport": "tcp", "protocol": 5, "load": 0})"},
      {"evil-empty", R"({"host": "", "port": 7000, "machine": "consumer-host", "transport": "tcp", "protocol": 5, "load": 0})"},
      {"evil-huge", R"({"host": "127.0.0.1", "port": 7000, "machine": "consumer-host", "transport": "tcp", "protocol": 5, "load": 1e308})"},
      {"evil-wrap", R"({"host": "127.0.0.1", "port": 7000, "machine": "consumer-host", "transport": "tcp", "protocol": 5, "load": 18446744073709551616})"}};
  for (const auto& [id, json] : evil) {
    ASSERT_TRUE(corma::testing::run(io, writer.put(corma::directory::owner_key(c, id), json, 0)));
    ASSERT_TRUE(corma::testing::run(io, writer.put(corma::directory::prefix_key(c, "", id), "", 0)));
  }
  std::map<std::string, int> reported;
  c.on_rejected_entry = [&reported](const std::string& id, const corma::Error&) { ++reported[id]; };
  corma::Directory consumer(io.get_executor(), c);
  EXPECT_EQ(resolve_ids(consumer, "obj"), std::vector<std::string>{"owner-good"});
  EXPECT_EQ(resolve_ids(consumer, "other"), std::vector<std::string>{}) << "a bad owner's prefix served a name";
  EXPECT_EQ(resolve_ids(consumer, "obj"), std::vector<std::string>{"owner-good"});
  EXPECT_EQ(consumer.stats().rejected_entries, evil.size());
  EXPECT_EQ(reported.size(), evil.size());
  for (const auto& [id, times] : reported) EXPECT_EQ(times, 1) << id << " reported more than once";
  // A changed bad entry is a new one.
  ASSERT_TRUE(corma::testing::run(
      io, writer.put(corma::directory::owner_key(c, "evil-host"),
                     R"({"host": "still-no-ip", "port": 7000, "machine": "m", "transport": "tcp", "protocol": 5, "load": 0})", 0)));
  // (Seen once the watch reports the change.)
  EXPECT_TRUE(resolves_eventually(
      consumer, "obj",
      [&](const auto& ids) {
        return ids == std::vector<std::string>{"owner-good"} && consumer.stats().rejected_entries == evil.size() + 1;
      },
      std::chrono::seconds(5)));
  EXPECT_EQ(reported["evil-host"], 2);
  // A listing shows every entry, each bad one with why consumers skip it,
  // and a name whose owner has no entry at all.
  ASSERT_TRUE(corma::testing::run(io, writer.put(corma::directory::name_key(c, "orphan", "owner-gone"), "", 0)));
  auto listed = corma::testing::run(io, consumer.async_list(""));
  ASSERT_TRUE(listed) << listed.error().message();
  std::map<std::string, std::string> unusable;
  for (const auto& entry : listed.value()) unusable[entry.owner] = entry.unusable;
  EXPECT_EQ(unusable.at("owner-good"), "");
  for (const auto& [id, json] : evil) {
    EXPECT_NE(unusable.at(id), "") << id << " is listed as usable";
  }
  EXPECT_NE(unusable.at("evil-host").find("is an IP address, not"), std::string::npos) << unusable.at("evil-host");
  EXPECT_EQ(unusable.at("owner-gone"), "it has no owner entry");
  // And none can be announced.
  corma::Directory bad(io.get_executor(), config());
  auto refused = corma::testing::run(io, bad.async_announce(owner("owner-bad", "m", corma::directory::max_owner_load + 1, {"obj"})));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::out_of_range)) << refused.error().message();
}

/// What a watch told of a stream that went live, sent `event_line`, then
/// stayed open and silent: whether it went live and then broke, and the
/// keys it reported changed.
struct WatchSaw {
  std::vector<bool> live;
  std::vector<std::string> changed;
  [[nodiscard]] bool broke() const { return live == std::vector<bool>{true, false}; }
};

WatchSaw watch_given(const std::string& event_line) {
  asio::io_context io;
  asio::ip::tcp::acceptor fake_etcd(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::ip::tcp::socket held(io);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        held = co_await fake_etcd.async_accept(asio::use_awaitable);
        std::array<char, 4096> request{};
        (void)co_await held.async_read_some(asio::buffer(request), asio::as_tuple(asio::use_awaitable));
        const std::string stream = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
                                   R"({"result":{"created":true}})" "\n" + event_line + "\n";
        (void)co_await asio::async_write(held, asio::buffer(stream), asio::as_tuple(asio::use_awaitable));
      },
      asio::detached);
  WatchSaw saw;
  corma::directory::KeyWatch::Callbacks callbacks;
  callbacks.live = [&saw](bool live) { saw.live.push_back(live); };
  callbacks.changed = [&saw](const auto& change) { saw.changed.push_back(change.key); };
  corma::directory::EtcdAccess access;
  access.members.push_back(corma::EtcdMember{"127.0.0.1", fake_etcd.local_endpoint().port()});
  auto watch = std::make_shared<corma::directory::KeyWatch>(io.get_executor(), access, "/p/", std::chrono::hours(1),
                                                            callbacks);
  watch->start();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (saw.live.size() < 2 && saw.changed.empty() && std::chrono::steady_clock::now() < until) {
    io.run_one_for(std::chrono::milliseconds(100));
  }
  watch->stop();
  return saw;
}

TEST(DirectoryWatch, AnEventItCannotReadBreaksTheWatchSoNothingCachedIsTrustedAsIfNoChangeWasMissed) {
  for (const std::string bad : {R"({"result":{"events":[{"kv":{"key":5}}]}})", R"({"result":{"events":[{"kv":{"key":"not base64!"}}]}})",
                                R"({"result":{"events":{"kv":1}}})", R"({"result":{"events":[7]}})", R"({"result":[1,2]})",
                                R"({"result":{"canceled":"yes"}})"}) {
    EXPECT_TRUE(watch_given(bad).broke()) << bad;
  }
  const auto good = watch_given(R"({"result":{"events":[{"kv":{"key":"L3AveA=="}}]}})");
  EXPECT_EQ(good.changed, std::vector<std::string>{"/p/x"});
  EXPECT_EQ(good.live, std::vector<bool>{true});
}

TEST(DirectoryRecords, KeysAndEntriesAreCheckedBeforeUse) {
  corma::DirectoryConfig config;
  const auto key = corma::directory::name_key(config, "a/b", "owner-1");
  EXPECT_EQ(key, std::string("/corma/names/a/b") + '\0' + "owner-1");
  auto split = corma::directory::split_name_key(key, corma::directory::names_prefix(config));
  ASSERT_TRUE(split);
  EXPECT_EQ(split->name, "a/b");
  EXPECT_EQ(split->owner, "owner-1");
  EXPECT_FALSE(corma::directory::split_name_key("/corma/names/no-owner", corma::directory::names_prefix(config)));
  EXPECT_FALSE(corma::directory::decode_owner("x", "{\"host\": 1}"));
  EXPECT_FALSE(corma::directory::decode_owner("x", "not json"));
  EXPECT_FALSE(corma::directory::check_owner_id("has/slash"));
  EXPECT_FALSE(corma::directory::check_owner_id(""));
  corma::OwnerEntry entry{"o", "10.0.0.1", 7000, "m", "verbs", 3, 42};
  auto back = corma::directory::decode_owner("o", corma::directory::encode_owner(entry));
  ASSERT_TRUE(back);
  EXPECT_EQ(back.value().port, 7000);
  EXPECT_EQ(back.value().load, 42u);
  for (std::string bytes : {std::string(""), std::string("a"), std::string("ab"), std::string("abc"),
                            std::string("\0\xff\x10", 3)}) {
    EXPECT_EQ(corma::directory::from_base64(corma::directory::to_base64(bytes)).value(), bytes);
  }
  EXPECT_FALSE(corma::directory::from_base64("abc"));
  EXPECT_FALSE(corma::directory::from_base64("ab!="));
  EXPECT_EQ(corma::directory::prefix_end("a/b"), "a/c");
  EXPECT_TRUE(corma::parse_directory_address("http://127.0.0.1:2379"));
  EXPECT_FALSE(corma::parse_directory_address("127.0.0.1"));
  EXPECT_FALSE(corma::parse_directory_address("127.0.0.1:99999"));
  auto members = corma::parse_directory_address("127.0.0.1:2379,http://127.0.0.2:2380/,127.0.0.3:2381");
  ASSERT_TRUE(members);
  EXPECT_EQ(members.value().port, 2379);
  ASSERT_EQ(members.value().other_members.size(), 2u);
  EXPECT_EQ(members.value().other_members[0].host, "127.0.0.2");
  EXPECT_EQ(members.value().other_members[1].port, 2381);
  EXPECT_EQ(corma::directory::access_of(members.value()).members.size(), 3u);
  EXPECT_FALSE(members.value().tls);
  auto secured = corma::parse_directory_address("https://127.0.0.1:2379,https://127.0.0.2:2379");
  ASSERT_TRUE(secured);
  EXPECT_TRUE(secured.value().tls);
  EXPECT_TRUE(corma::parse_directory_address("https://127.0.0.1:2379,http://127.0.0.2:2379")
                  .error()
                  .is(corma::errc::out_of_range));
  EXPECT_FALSE(corma::parse_directory_address("127.0.0.1:2379,"));
  EXPECT_FALSE(corma::parse_directory_address("127.0.0.1:2379,:1"));
}

/// An owner entry as JSON text, one field replaced by `value` (raw JSON).
std::string owner_json_with(const std::string& field, const std::string& value) {
  std::map<std::string, std::string> fields = {{"host", "\"10.0.0.1\""}, {"port", "7000"},   {"machine", "\"m\""},
                                               {"transport", "\"tcp\""},  {"protocol", "5"}, {"load", "3"}};
  fields[field] = value;
  std::string json = "{";
  for (const auto& [name, text] : fields) json += (json.size() > 1 ? ", \"" : "\"") + name + "\": " + text;
  return json + "}";
}

TEST(DirectoryRecords, AnOwnerEntryAConsumerCouldNotRankOrReachIsRefusedFieldByField) {
  ASSERT_TRUE(corma::directory::decode_owner("o", owner_json_with("load", "3")));
  ASSERT_TRUE(corma::directory::decode_owner("o", owner_json_with("host", "\"::1\"")));
  EXPECT_EQ(corma::directory::decode_owner("o", owner_json_with("load", "1099511627776")).value().load,
            corma::directory::max_owner_load);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"host", "\"not-an-ip\""},  {"host", "\"\""},          {"host", "\"10.0.0.1:80\""},
      {"port", "0"},              {"port", "70000"},         {"port", "\"7000\""},
      {"port", "-1"},             {"machine", std::string("\"") + std::string(300, 'm') + "\""},
      {"transport", "\"pigeon\""}, {"transport", "\"\""},     {"protocol", "0"},
      {"protocol", "1.5"},        {"load", "1e308"},         {"load", "18446744073709551616"},
      {"load", "-1"},             {"load", "0.5"},           {"load", "1099511627777"},
      {"load", "null"}};
  for (const auto& [field, value] : refused) {
    auto decoded = corma::directory::decode_owner("o", owner_json_with(field, value));
    ASSERT_FALSE(decoded) << field << " = " << value << " was accepted";
    EXPECT_TRUE(decoded.error().is(errc::protocol)) << decoded.error().message();
  }
  // The same rules for what an owner announces.
  corma::OwnerEntry entry{"o", "a-name", 7000, "m", "tcp", 5, 0};
  EXPECT_TRUE(corma::directory::check_owner_entry(entry).error().is(errc::out_of_range));
  entry.host = "10.0.0.1";
  entry.load = corma::directory::max_owner_load + 1;
  EXPECT_FALSE(corma::directory::check_owner_entry(entry));
  entry.load = 0;
  EXPECT_TRUE(corma::directory::check_owner_entry(entry));
}

}  // namespace
