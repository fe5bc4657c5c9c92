// Versions across replicas, over a real etcd: owners announce the version
// of a name they hold, consumers rank the newest first, can ask for one
// version, and a fetch that loses its owner part way through goes on only
// with an owner of the same version. A name entry whose version is not a
// whole number is skipped, not trusted.
#include "directory/announced_owner.hpp"
#include "directory/etcd_client.hpp"
#include "directory/records.hpp"

#include <corma/cluster_consumer.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

namespace {

namespace asio = boost::asio;
using corma::errc;
using corma::testing::AnnouncedOwner;

class VersionsTest : public corma::testing::ClusterTest {
 protected:
  /// Three replicas of "obj", each with bytes of its own: the newest is the
  /// most loaded, the one without a version the least.
  std::vector<std::byte> old_bytes = filled(0x01), new_bytes = filled(0x02), unversioned_bytes = filled(0x03);

  [[nodiscard]] std::vector<std::byte> filled(int seed) const {
    std::vector<std::byte> v(bytes.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::byte>(i * 7 + static_cast<std::size_t>(seed));
    return v;
  }

  /// An owner serving "obj" in 4 KiB chunks, so that a fetch of it takes
  /// many pulls.
  std::unique_ptr<AnnouncedOwner> replica(const std::string& id, std::uint64_t load, const std::vector<std::byte>& content,
                                          std::optional<std::uint64_t> version) {
    corma::OwnerConfig small_chunks;
    small_chunks.chunk_size = 4096;
    auto owner = std::make_unique<AnnouncedOwner>(io, config(), id, load, content, small_chunks,
                                                  std::chrono::seconds(5), version);
    EXPECT_TRUE(owner->announced) << owner->announced.error().message();
    return owner;
  }

  /// "obj" into `into`, calling `on_chunk` after each chunk lands.
  corma::Result<corma::ClusterOutcome> fetch(corma::ClusterConsumer& cluster, std::vector<std::byte>& into,
                                             corma::ClusterFetchOptions options = {},
                                             std::function<void()> on_chunk = {}) {
    into.assign(bytes.size(), std::byte{0});
    corma::StreamDestination destination{[&into, on_chunk](std::uint64_t offset, std::span<const std::byte> chunk) {
                                           std::copy(chunk.begin(), chunk.end(),
                                                     into.begin() + static_cast<std::ptrdiff_t>(offset));
                                           if (on_chunk) on_chunk();
                                           return corma::success();
                                         },
                                         {}};
    return corma::testing::run(io, cluster.async_fetch_to("obj", std::move(destination), options));
  }

  /// "obj" fetched through a fresh ClusterConsumer, `serving` killed once
  /// the first chunk of it has landed.
  corma::Result<corma::ClusterOutcome> fetch_losing(AnnouncedOwner& serving, std::vector<std::byte>& into) {
    corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                   nullptr, bounded());
    bool killed = false;
    auto fetched = fetch(cluster, into, {}, [&] {
      if (!std::exchange(killed, true)) serving.kill();
    });
    EXPECT_TRUE(killed);
    return fetched;
  }

  corma::ConsumerConfig bounded() {
    corma::ConsumerConfig c;
    c.io_timeout = std::chrono::seconds(2);
    return c;
  }
};

TEST_F(VersionsTest, ReplicasAreRankedNewestFirstWhateverTheirLoadAndTheOutcomeNamesTheVersion) {
  auto old_owner = replica("owner-old", 0, old_bytes, 1);
  auto new_owner = replica("owner-new", 9, new_bytes, 2);
  auto plain_owner = replica("owner-plain", 0, unversioned_bytes, std::nullopt);
  auto directory = std::make_shared<corma::Directory>(io.get_executor(), config());
  auto resolved = corma::testing::run(io, directory->async_resolve("obj"));
  ASSERT_TRUE(resolved) << resolved.error().message();
  ASSERT_EQ(resolved.value().size(), 3u);
  EXPECT_EQ(resolved.value()[0].id, "owner-new");
  EXPECT_EQ(resolved.value()[0].version, std::optional<std::uint64_t>(2));
  EXPECT_EQ(resolved.value()[1].id, "owner-old");
  EXPECT_EQ(resolved.value()[2].id, "owner-plain") << "an owner that says no version comes after every one that does";
  EXPECT_EQ(resolved.value()[2].version, std::nullopt);

  corma::ClusterConsumer cluster(io.get_executor(), directory, nullptr, bounded());
  std::vector<std::byte> got;
  auto fetched = fetch(cluster, got);
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().owner, "owner-new");
  EXPECT_EQ(fetched.value().version, std::optional<std::uint64_t>(2));
  EXPECT_EQ(got, new_bytes);
}

TEST_F(VersionsTest, AVersionAskedForComesFromAnOwnerHoldingItAndOneNobodyHoldsIsObjectChanged) {
  auto old_owner = replica("owner-old", 0, old_bytes, 1);
  auto new_owner = replica("owner-new", 0, new_bytes, 2);
  corma::ClusterConsumer cluster(io.get_executor(), std::make_shared<corma::Directory>(io.get_executor(), config()),
                                 nullptr, bounded());
  std::vector<std::byte> got;
  corma::ClusterFetchOptions older;
  older.version = 1;
  auto fetched = fetch(cluster, got, older);
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().owner, "owner-old");
  EXPECT_EQ(got, old_bytes);

  corma::ClusterFetchOptions missing;
  missing.version = 3;
  auto none = fetch(cluster, got, missing);
  ASSERT_FALSE(none);
  EXPECT_TRUE(none.error().is(errc::object_changed)) << none.error().message();
  EXPECT_NE(none.error().message().find("no owner announces version 3 of 'obj'"), std::string::npos)
      << none.error().message();
}

TEST_F(VersionsTest, AnOwnerLostPartWayIsReplacedOnlyByAnOwnerOfTheSameVersion) {
  auto new_owner = replica("owner-new", 0, new_bytes, 2);
  auto same_version = replica("owner-same", 5, new_bytes, 2);
  auto old_owner = replica("owner-old", 0, old_bytes, 1);
  std::vector<std::byte> got;
  auto fetched = fetch_losing(*new_owner, got);
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().owner, "owner-same") << "the older replica ranks before it by load, but holds another version";
  ASSERT_EQ(fetched.value().failed.size(), 1u);
  EXPECT_EQ(fetched.value().failed.front().owner, "owner-new");
  EXPECT_EQ(got, new_bytes);
}

TEST_F(VersionsTest, WithNoOwnerOfTheSameVersionLeftAFetchLostPartWayEndsObjectChangedNotMixed) {
  auto new_owner = replica("owner-new", 0, new_bytes, 2);
  auto old_owner = replica("owner-old", 0, old_bytes, 1);
  auto plain_owner = replica("owner-plain", 0, unversioned_bytes, std::nullopt);
  std::vector<std::byte> got;
  auto fetched = fetch_losing(*new_owner, got);
  ASSERT_FALSE(fetched) << "served by " << fetched.value().owner;
  EXPECT_TRUE(fetched.error().is(errc::object_changed)) << fetched.error().message();
  EXPECT_NE(fetched.error().message().find("owner-old: corma: object changed while it was read: holds version 1, and part of version 2 was written"),
            std::string::npos)
      << fetched.error().message();
  EXPECT_EQ(old_owner->owner.stats().connections, 0u) << "the older replica was never asked";
  EXPECT_EQ(plain_owner->owner.stats().connections, 0u);
}

TEST_F(VersionsTest, ANameEntryWhoseVersionIsNotAWholeNumberIsSkippedCountedAndListedAsSkipped) {
  auto good = replica("owner-good", 9, old_bytes, 1);
  auto forged = replica("owner-forged", 0, new_bytes, 2);
  const auto c = config();
  corma::directory::EtcdClient writer(io.get_executor(), "127.0.0.1", c.port, std::chrono::seconds(2));
  for (const std::string bad : {"{\"version\": 1e308}", "{\"version\": -1}", "{\"version\": \"2\"}", "7",
                                "{\"version\": 2, \"load\": 0}"}) {
    corma::testing::run(io, [&]() -> asio::awaitable<void> {
      EXPECT_TRUE(co_await writer.put(corma::directory::name_key(c, "obj", "owner-forged"), bad, 0));
    }());
    auto directory = std::make_shared<corma::Directory>(io.get_executor(), c);
    auto resolved = corma::testing::run(io, directory->async_resolve("obj"));
    ASSERT_TRUE(resolved) << resolved.error().message();
    ASSERT_EQ(resolved.value().size(), 1u) << bad;
    EXPECT_EQ(resolved.value().front().id, "owner-good") << bad;
    EXPECT_EQ(directory->stats().rejected_entries, 1u) << bad;
    auto listing = corma::testing::run(io, directory->async_list("obj"));
    ASSERT_TRUE(listing) << listing.error().message();
    const auto it = std::find_if(listing.value().begin(), listing.value().end(),
                                 [](const corma::DirectoryListing& l) { return l.owner == "owner-forged"; });
    ASSERT_NE(it, listing.value().end());
    EXPECT_NE(it->unusable.find("not {\"version\": a whole number}"), std::string::npos) << it->unusable;
  }
}

TEST_F(VersionsTest, AnOwnerAnnouncedAnewKeepsItsLeaseWritesWhatChangedAndDeletesWhatWentAway) {
  corma::Directory owner(io.get_executor(), config());
  corma::Announcement a;
  a.owner = corma::OwnerEntry{"owner-x", "127.0.0.1", 7000, "host", "none", 3, 0};
  a.names = {"kept", "changed", "dropped"};
  a.versions = {{"kept", 1}, {"changed", 1}};
  ASSERT_TRUE(corma::testing::run(io, owner.async_announce(a)));
  a.names = {"kept", "changed", "added"};
  a.versions = {{"kept", 1}, {"changed", 2}, {"added", 5}};
  auto again = corma::testing::run(io, owner.async_announce(a));
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(owner.stats().leases_granted, 1u) << "the same lease: the owner was never missing";

  corma::Directory consumer(io.get_executor(), config());
  const auto version_of = [&](const std::string& name) -> corma::Result<std::optional<std::uint64_t>> {
    CORMA_TRY(auto owners, corma::testing::run(io, consumer.async_resolve(name)));
    return owners.front().version;
  };
  EXPECT_EQ(version_of("kept").value(), std::optional<std::uint64_t>(1));
  EXPECT_EQ(version_of("changed").value(), std::optional<std::uint64_t>(2));
  EXPECT_EQ(version_of("added").value(), std::optional<std::uint64_t>(5));
  auto dropped = version_of("dropped");
  ASSERT_FALSE(dropped);
  EXPECT_TRUE(dropped.error().is(errc::region_not_found)) << dropped.error().message();
  // Withdrawn, everything goes with the lease.
  ASSERT_TRUE(corma::testing::run(io, owner.async_withdraw()));
  corma::Directory later(io.get_executor(), config());
  EXPECT_FALSE(corma::testing::run(io, later.async_resolve("kept")));
}

TEST_F(VersionsTest, AVersionForANameNotAnnouncedIsRefused) {
  corma::Directory directory(io.get_executor(), config());
  corma::Announcement a;
  a.owner = corma::OwnerEntry{"owner-x", "127.0.0.1", 7000, "host", "none", 3, 0};
  a.names = {"obj"};
  a.versions["other"] = 1;
  auto announced = corma::testing::run(io, directory.async_announce(std::move(a)));
  ASSERT_FALSE(announced);
  EXPECT_TRUE(announced.error().is(errc::out_of_range)) << announced.error().message();
}

}  // namespace
