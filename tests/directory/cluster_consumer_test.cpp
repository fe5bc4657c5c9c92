// ClusterConsumer over a real etcd and two in-process owners serving the
// same object: it fetches from the owner the directory ranks first, keeps
// one connection per owner, and when that owner is lost fetches from the
// other, saying which owner served it and which failed.
#include "directory/announced_owner.hpp"

#include <corma/cluster_consumer.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <optional>
#include <map>

#include "support/test_backend.hpp"

namespace {

namespace asio = boost::asio;
using corma::errc;
using corma::testing::AnnouncedOwner;

class ClusterConsumerTest : public corma::testing::ClusterTest {
 protected:
  corma::Result<corma::ClusterOutcome> fetch(corma::ClusterConsumer& cluster, std::vector<std::byte>& into) {
    into.assign(bytes.size(), std::byte{0});
    corma::StreamDestination destination{[&into](std::uint64_t offset, std::span<const std::byte> chunk) {
                                           std::copy(chunk.begin(), chunk.end(), into.begin() + static_cast<std::ptrdiff_t>(offset));
                                           return corma::success();
                                         },
                                         {}};
    return corma::testing::run(io, cluster.async_fetch_to("obj", std::move(destination)));
  }

  /// Every "part-<i>" into its place in `region`, as one set.
  corma::Result<corma::ClusterManyFetched> fetch_parts(corma::ClusterConsumer& cluster, corma::RegionGuard& region) {
    std::vector<std::string> names;
    std::vector<corma::FetchSlot> slots;
    for (std::size_t i = 0; i < AnnouncedOwner::parts; ++i) {
      names.push_back("part-" + std::to_string(i));
      slots.push_back({&region, i * AnnouncedOwner::part_size, AnnouncedOwner::part_size});
    }
    return corma::testing::run(io, cluster.async_fetch_many(std::move(names), std::move(slots)));
  }

  /// Every part of `set` arrived, each from `owner`.
  static void expect_every_part_from(const corma::Result<corma::ClusterManyFetched>& set, const std::string& owner) {
    ASSERT_TRUE(set) << set.error().message();
    for (std::size_t i = 0; i < AnnouncedOwner::parts; ++i) {
      ASSERT_TRUE(set.value().outcomes[i]) << set.value().outcomes[i].error().message();
      EXPECT_EQ(set.value().owners[i], owner);
    }
  }
};

TEST_F(ClusterConsumerTest, ALostOwnerIsReplacedByTheNextReplicaAndTheOutcomeSaysWhichServed) {
  auto primary = std::make_unique<AnnouncedOwner>(io, config(), "owner-primary", 1, bytes);
  AnnouncedOwner replica(io, config(), "owner-replica", 7, bytes);
  ASSERT_TRUE(primary->announced);
  ASSERT_TRUE(replica.announced);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr);
  std::vector<std::byte> got;
  auto first = fetch(cluster, got);
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_EQ(first.value().owner, "owner-primary") << "the least loaded first";
  EXPECT_TRUE(first.value().failed.empty());
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(cluster.pooled(), 1u);

  // The primary dies without withdrawing: the directory still lists it.
  primary->kill();
  auto second = fetch(cluster, got);
  ASSERT_TRUE(second) << second.error().message();
  EXPECT_EQ(second.value().owner, "owner-replica");
  ASSERT_EQ(second.value().failed.size(), 1u);
  EXPECT_EQ(second.value().failed.front().owner, "owner-primary");
  EXPECT_EQ(got, bytes);

  replica.kill();
  auto none = fetch(cluster, got);
  ASSERT_FALSE(none);
  EXPECT_TRUE(none.error().is(errc::peer_unreachable)) << none.error().message();
  primary.reset();
}

TEST_F(ClusterConsumerTest, WithAClusterKeyOwnersThatCannotProveTheirEntrysIdAreLeftForOneThatCan) {
  const std::string key = "the cluster's key, 32 bytes long";
  corma::OwnerConfig keyed;
  keyed.cluster_key = key;
  keyed.owner_id = "owner-good";
  AnnouncedOwner good(io, config(), "owner-good", 7, bytes, keyed);
  // Both rank first and serve bytes of their own: one without the key, one
  // holding it under another entry's id.
  const std::vector<std::byte> forged(bytes.size(), std::byte{0x66});
  AnnouncedOwner impostor(io, config(), "owner-impostor", 0, forged);
  AnnouncedOwner misnamed(io, config(), "owner-misnamed", 1, forged, keyed);
  ASSERT_TRUE(good.announced && impostor.announced && misnamed.announced);
  auto directory = std::make_shared<corma::Directory>(io.get_executor(), config());
  corma::ConsumerConfig with_key;
  with_key.cluster_key = key;
  corma::ClusterConsumer cluster(io.get_executor(), directory, nullptr, with_key);
  std::vector<std::byte> got;
  auto fetched = fetch(cluster, got);
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().owner, "owner-good");
  EXPECT_EQ(got, bytes);
  ASSERT_EQ(fetched.value().failed.size(), 2u);
  for (const auto& failed : fetched.value().failed) {
    EXPECT_TRUE(failed.error.is(errc::not_owned)) << failed.owner << ": " << failed.error.message();
  }
  EXPECT_EQ(impostor.owner.stats().decisions.chunked() + misnamed.owner.stats().decisions.chunked(), 0u)
      << "an owner that failed the proof was asked for the object";

  // Without a key, the ranking is all there is: the impostor serves.
  corma::ClusterConsumer keyless(io.get_executor(), directory, nullptr);
  auto trusting = fetch(keyless, got);
  ASSERT_TRUE(trusting) << trusting.error().message();
  EXPECT_EQ(trusting.value().owner, "owner-impostor");
  EXPECT_EQ(got, forged);
}

TEST_F(ClusterConsumerTest, ARangeIsFetchedFromTheOwnerThatServesItAndSaysThatOwnersVersion) {
  AnnouncedOwner owner(io, config(), "owner-one", 1, bytes);
  ASSERT_TRUE(owner.announced);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr);
  ASSERT_GT(bytes.size(), 100u);
  const corma::ByteRange range{10, bytes.size() - 60};
  std::vector<std::byte> got;
  corma::StreamDestination destination{[&got, &range](std::uint64_t offset,
                                                      std::span<const std::byte> chunk) -> corma::Result<void> {
                                         if (offset != range.offset + got.size()) {
                                           return corma::fail(errc::protocol, "out of order");
                                         }
                                         got.insert(got.end(), chunk.begin(), chunk.end());
                                         return corma::success();
                                       },
                                       {}};
  auto fetched = corma::testing::run(io, cluster.async_fetch_to("obj", std::move(destination), range));
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().owner, "owner-one");
  EXPECT_EQ(fetched.value().fetch.length, *range.length);
  EXPECT_TRUE(fetched.value().fetch.generation.has_value());
  const auto from = bytes.begin() + static_cast<std::ptrdiff_t>(range.offset);
  EXPECT_EQ(got, std::vector<std::byte>(from, from + static_cast<std::ptrdiff_t>(*range.length)));
  // A range past the end is the object's own error: no other owner is tried.
  std::vector<std::byte> unused;
  corma::StreamDestination nowhere{[](std::uint64_t, std::span<const std::byte>) { return corma::success(); }, {}};
  auto refused =
      corma::testing::run(io, cluster.async_fetch_to("obj", std::move(nowhere), corma::ByteRange{bytes.size() + 1}));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::out_of_range)) << refused.error().message();
}

TEST_F(ClusterConsumerTest, APooledConnectionTheOwnerClosedForIdlenessIsReplacedNotCountedAsTheOwnersLoss) {
  corma::OwnerConfig quick;
  quick.idle_timeout = std::chrono::milliseconds(200);
  AnnouncedOwner only(io, config(), "owner-only", 1, bytes, quick);
  ASSERT_TRUE(only.announced);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr);
  std::vector<std::byte> got;
  auto first = fetch(cluster, got);
  ASSERT_TRUE(first) << first.error().message();
  // The owner closes the idle connection; the pool still holds it.
  io.restart();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (only.owner.stats().open_connections != 0 && std::chrono::steady_clock::now() < deadline) {
    io.run_one_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(only.owner.stats().open_connections, 0U);
  EXPECT_EQ(cluster.pooled(), 1U);
  auto second = fetch(cluster, got);
  ASSERT_TRUE(second) << "the only owner was given up for a connection it closed: " << second.error().message();
  EXPECT_EQ(second.value().owner, "owner-only");
  EXPECT_TRUE(second.value().failed.empty());
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(cluster.pooled(), 1U);
  EXPECT_EQ(only.owner.stats().connections, 2U);
}

TEST_F(ClusterConsumerTest, ASetIsSpreadOverTheReplicasAndALostOwnersObjectsGoToTheOthers) {
  auto first = std::make_unique<AnnouncedOwner>(io, config(), "owner-1", 0, bytes);
  AnnouncedOwner second(io, config(), "owner-2", 0, bytes);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr);
  std::vector<std::byte> landing(AnnouncedOwner::parts * AnnouncedOwner::part_size);
  corma::Registry registry(corma::testing::TestBackend::create(), corma::RegistryConfig{1 << 30, 0});
  auto region =
      corma::testing::run(io, registry.async_register(landing, corma::Access::local, asio::use_awaitable)).value();
  auto fetch_all = [&] {
    std::fill(landing.begin(), landing.end(), std::byte{0});
    return fetch_parts(cluster, region);
  };
  const std::span whole(bytes.data(), landing.size());
  auto spread = fetch_all();
  ASSERT_TRUE(spread) << spread.error().message();
  std::map<std::string, int> served;
  for (std::size_t i = 0; i < AnnouncedOwner::parts; ++i) {
    ASSERT_TRUE(spread.value().outcomes[i]) << spread.value().outcomes[i].error().message();
    ++served[spread.value().owners[i]];
  }
  EXPECT_EQ(served.size(), 2u) << "equal owners share the set (the name's hash orders them)";
  EXPECT_TRUE(std::equal(landing.begin(), landing.end(), whole.begin()));

  first->kill();
  ASSERT_NO_FATAL_FAILURE(expect_every_part_from(fetch_all(), "owner-2"));
  EXPECT_TRUE(std::equal(landing.begin(), landing.end(), whole.begin()));
  first.reset();
}

/// Announces `id` at `port` of 127.0.0.1 with load 0 (so it ranks first):
/// a well-formed entry for something that is not a working owner.
std::unique_ptr<corma::Directory> announce_impostor(asio::io_context& io, const corma::DirectoryConfig& config,
                                                   std::string id, std::uint16_t port) {
  auto directory = std::make_unique<corma::Directory>(io.get_executor(), config);
  corma::Announcement a;
  a.owner = corma::OwnerEntry{std::move(id), "127.0.0.1", port, "host", "none", 5, 0};
  a.prefixes = {""};
  EXPECT_TRUE(corma::testing::run(io, directory->async_announce(std::move(a))));
  return directory;
}

TEST_F(ClusterConsumerTest, OwnersThatAreNotCormaSilentOrGoneAreLeftForTheNextAndTheOutcomeSaysWhy) {
  AnnouncedOwner good(io, config(), "owner-good", 7, bytes);
  ASSERT_TRUE(good.announced);
  // An HTTP server's answer on one port, a listener that never speaks on
  // another, and a port nobody listens on.
  asio::ip::tcp::acceptor http(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::co_spawn(
      io,
      [&http]() -> asio::awaitable<void> {
        for (;;) {
          auto [ec, socket] = co_await http.async_accept(asio::as_tuple(asio::use_awaitable));
          if (ec) co_return;
          static constexpr std::string_view reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
          (void)co_await asio::async_write(socket, asio::buffer(reply), asio::as_tuple(asio::use_awaitable));
        }
      },
      asio::detached);
  asio::ip::tcp::acceptor silent(io, {asio::ip::make_address("127.0.0.1"), 0});
  silent.listen();  // connections complete in the backlog and are never answered
  std::uint16_t gone_port = 0;
  {
    asio::ip::tcp::acceptor closed(io, {asio::ip::make_address("127.0.0.1"), 0});
    gone_port = closed.local_endpoint().port();
  }
  const auto impostors = {announce_impostor(io, config(), "not-corma", http.local_endpoint().port()),
                          announce_impostor(io, config(), "silent", silent.local_endpoint().port()),
                          announce_impostor(io, config(), "gone", gone_port)};
  corma::ConsumerConfig consumer_config;
  consumer_config.io_timeout = std::chrono::milliseconds(300);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr, consumer_config);
  std::vector<std::byte> got;
  auto fetched = fetch(cluster, got);
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().owner, "owner-good");
  EXPECT_EQ(got, bytes);
  std::map<std::string, corma::Error> left;
  for (const auto& failed : fetched.value().failed) left.emplace(failed.owner, failed.error);
  ASSERT_EQ(left.size(), 3u) << "every impostor ranks first and is tried once";
  EXPECT_FALSE(left.at("not-corma").is(errc::cancelled)) << left.at("not-corma").message();
  EXPECT_TRUE(left.at("silent").is(errc::timeout)) << left.at("silent").message();
  EXPECT_TRUE(left.at("gone").is(errc::peer_unreachable)) << left.at("gone").message();

  // A set goes the same way: every name ends at the good owner.
  std::vector<std::byte> landing(AnnouncedOwner::parts * AnnouncedOwner::part_size);
  corma::Registry registry(corma::testing::TestBackend::create(), corma::RegistryConfig{1 << 30, 0});
  auto region =
      corma::testing::run(io, registry.async_register(landing, corma::Access::local, asio::use_awaitable)).value();
  ASSERT_NO_FATAL_FAILURE(expect_every_part_from(fetch_parts(cluster, region), "owner-good"));
  EXPECT_TRUE(std::equal(landing.begin(), landing.end(), bytes.begin()));
  http.close();
}

TEST_F(ClusterConsumerTest, ASetCancelledWhileAnOwnerIsSilentAnswersCancelledAndTriesNoOtherOwner) {
  // An owner that accepts connections and never says a word, ranked first,
  // and a good one behind it.
  asio::ip::tcp::acceptor silent(io, {asio::ip::make_address("127.0.0.1"), 0});
  std::optional<asio::ip::tcp::socket> held;
  silent.async_accept([&](boost::system::error_code, asio::ip::tcp::socket socket) { held.emplace(std::move(socket)); });
  corma::Directory silent_directory(io.get_executor(), config());
  corma::Announcement a;
  a.names = {"part-0", "part-1"};
  a.owner = corma::OwnerEntry{"owner-silent", "127.0.0.1", silent.local_endpoint().port(), "host", "none", 3, 0};
  a.ttl = std::chrono::seconds(5);
  ASSERT_TRUE(corma::testing::run(io, silent_directory.async_announce(std::move(a))));
  AnnouncedOwner good(io, config(), "owner-good", 9, bytes);
  corma::ConsumerConfig consumer_config;
  consumer_config.io_timeout = std::chrono::milliseconds(1500);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr, consumer_config);
  std::vector<std::byte> landing(2 * AnnouncedOwner::part_size);
  corma::Registry registry(corma::testing::TestBackend::create(), corma::RegistryConfig{1 << 30, 0});
  auto region =
      corma::testing::run(io, registry.async_register(landing, corma::Access::local, asio::use_awaitable)).value();
  std::optional<corma::Result<corma::ClusterManyFetched>> outcome;
  asio::cancellation_signal cancel;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    std::vector<std::string> names{"part-0", "part-1"};
    std::vector<corma::FetchSlot> slots{{&region, 0, AnnouncedOwner::part_size},
                                        {&region, AnnouncedOwner::part_size, AnnouncedOwner::part_size}};
    cluster.async_fetch_many(std::move(names), std::move(slots),
                             asio::bind_cancellation_slot(cancel.slot(), [&](corma::Result<corma::ClusterManyFetched> r) {
                               outcome.emplace(std::move(r));
                             }));
    asio::steady_timer tick(io);
    while (!held) {
      tick.expires_after(std::chrono::milliseconds(1));
      co_await tick.async_wait(asio::use_awaitable);
    }
    cancel.emit(asio::cancellation_type::terminal);
    while (!outcome) {
      tick.expires_after(std::chrono::milliseconds(1));
      co_await tick.async_wait(asio::use_awaitable);
    }
  }());
  ASSERT_TRUE(outcome.has_value());
  ASSERT_TRUE(*outcome) << outcome->error().message();
  for (const auto& one : outcome->value().outcomes) {
    ASSERT_FALSE(one) << "fetched after the set was cancelled";
    EXPECT_TRUE(one.error().is(errc::cancelled)) << one.error().message();
  }
  EXPECT_EQ(cluster.pooled(), 0U) << "the next owner was tried after the cancellation";
  (void)corma::testing::run(io, silent_directory.async_withdraw(asio::use_awaitable));
}

TEST_F(ClusterConsumerTest, AnUnannouncedNameIsNotFound) {
  AnnouncedOwner only(io, config(), "owner", 1, bytes);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr);
  auto outcome = corma::testing::run(io, cluster.async_fetch_to("other", corma::StreamDestination{
                                                                             [](std::uint64_t, std::span<const std::byte>) {
                                                                               return corma::success();
                                                                             },
                                                                             {}}));
  ASSERT_FALSE(outcome);
  EXPECT_TRUE(outcome.error().is(errc::region_not_found));
}

}  // namespace
