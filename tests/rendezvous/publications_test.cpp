// The generations an owner lends (FetchOutcome::generation): a number never
// names two versions of one name, whether the version was published or found
// by a resolver.
#include "rendezvous/owner/publications.hpp"

#include <gtest/gtest.h>

#include <array>
#include <memory>

namespace {

using corma::PublishedObject;
using corma::rendezvous::Publications;

std::array<std::byte, 8> bytes{};

PublishedObject object_kept_by(std::shared_ptr<const void> keepalive) { return PublishedObject{bytes, std::move(keepalive)}; }

TEST(Publications, ANamePublishedAgainOrUnpublishedAndPublishedAgainNeverGetsANumberBack) {
  Publications publications;
  EXPECT_EQ(publications.publication_of("a"), 0U);
  publications.publish("a", object_kept_by(nullptr));
  const auto first = publications.publication_of("a");
  EXPECT_NE(first, 0U);
  publications.publish("a", object_kept_by(nullptr));
  const auto second = publications.publication_of("a");
  EXPECT_NE(second, first);
  EXPECT_TRUE(publications.unpublish("a"));
  EXPECT_FALSE(publications.unpublish("a"));
  EXPECT_FALSE(publications.contains("a"));
  EXPECT_EQ(publications.publication_of("a"), 0U);
  publications.publish("a", object_kept_by(nullptr));
  EXPECT_NE(publications.publication_of("a"), first);
  EXPECT_NE(publications.publication_of("a"), second);
  ASSERT_NE(publications.find("a"), nullptr);
  EXPECT_EQ(publications.find("a")->bytes.data(), bytes.data());
}

TEST(Publications, AResolvedVersionKeepsItsGenerationWhileItsKeepaliveLivesAndOnlyThen) {
  Publications publications;
  publications.publish("published", object_kept_by(nullptr));
  const auto publication = publications.publication_of("published");
  auto snapshot = std::make_shared<int>(1);
  const auto first = publications.resolved_generation("file", object_kept_by(snapshot));
  EXPECT_NE(first, publication) << "a resolved version shares a number with a publication";
  EXPECT_EQ(publications.resolved_generation("file", object_kept_by(snapshot)), first);

  // Another version of the file (a new snapshot) is a new generation.
  auto next_snapshot = std::make_shared<int>(2);
  const auto second = publications.resolved_generation("file", object_kept_by(next_snapshot));
  EXPECT_NE(second, first);

  // A version gone and a new one made (maybe at the same address) is new too.
  next_snapshot.reset();
  auto third_snapshot = std::make_shared<int>(3);
  const auto third = publications.resolved_generation("file", object_kept_by(third_snapshot));
  EXPECT_NE(third, second);
  EXPECT_NE(third, first);

  // Without a keepalive nothing tells two look-ups' bytes apart.
  const auto unkept = publications.resolved_generation("table", object_kept_by(nullptr));
  EXPECT_NE(publications.resolved_generation("table", object_kept_by(nullptr)), unkept);
}

}  // namespace
