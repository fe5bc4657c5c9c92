// Peer set-up between real UCX backends, in-process, over shared memory and
// over trusted tcp on loopback: the peer that reads connects. A target hands
// nothing from an offer to UCX, refuses every malformed offer with
// `protocol` and keeps working; the peer it accepts is read-only.
#include "ucx/hostile_offers.hpp"
#include "ucx/settings.hpp"

#include <corma/ucx.hpp>

#include "wire.hpp"

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::errc;
namespace ucx = corma::ucx;
namespace wire = corma::ucx::wire;

using corma::testing::make_ucx;

class UcxHandshake : public ::testing::TestWithParam<corma::testing::UcxSetting> {
 protected:
  std::shared_ptr<ucx::Backend> reader = make_ucx(GetParam().config);
  std::shared_ptr<ucx::Backend> owner = make_ucx(GetParam().config);
  std::vector<std::byte> source = std::vector<std::byte>(64 << 10);
  std::vector<std::byte> destination = std::vector<std::byte>(64 << 10);

  /// Offer, accept, complete: the reader's peer for the owner, and the
  /// owner's (read-only) peer for the reader.
  std::pair<corma::PeerId, corma::PeerId> connect() {
    auto offer = reader->async_peer_offer(asio::use_future).get().value();
    auto answer = owner->async_peer_accept(offer.blob, asio::use_future).get();
    EXPECT_TRUE(answer) << answer.error().message();
    auto completed = reader->async_peer_complete(offer.peer, answer.value().blob, asio::use_future).get();
    EXPECT_TRUE(completed) << completed.error().message();
    return {offer.peer, answer.value().peer};
  }

  /// The reader gets all of `source` from the owner over `peer`.
  corma::Result<void> read_over(corma::PeerId peer) {
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 13 + 1);
    std::fill(destination.begin(), destination.end(), std::byte{0});
    auto remote = owner->async_map(source.data(), source.size(), Access::remote_read, asio::use_future).get().value();
    auto local =
        reader->async_map(destination.data(), destination.size(), Access::local, asio::use_future).get().value();
    corma::GetRequest get{peer, local.id, 0, remote.effective_addr, source.size(), remote.packed_key};
    auto got = reader->async_get(get, asio::use_future).get();
    EXPECT_TRUE(reader->async_unmap(local.id, asio::use_future).get());
    EXPECT_TRUE(owner->async_unmap(remote.id, asio::use_future).get());
    if (got) {
      EXPECT_EQ(source, destination);
    }
    return got;
  }
};

TEST_P(UcxHandshake, HostileOffersAreRefusedAndTheOwnerKeepsWorking) {
  // A real worker address in the old framing, as the old design's offer was.
  auto third = make_ucx(GetParam().config);
  const auto address = third->async_peer_accept(wire::encode_offer(), asio::use_future).get().value().blob;
  for (const auto& offer : corma::testing::hostile_offers(address)) {
    auto answer = owner->async_peer_accept(offer.bytes, asio::use_future).get();
    ASSERT_FALSE(answer) << offer.what << " was accepted";
    EXPECT_TRUE(answer.error().is(errc::protocol)) << offer.what << ": " << answer.error().message();
  }
  const auto [peer, accepted] = connect();
  auto got = read_over(peer);
  EXPECT_TRUE(got) << got.error().message();
}

TEST_P(UcxHandshake, TheAcceptedPeerIsReadOnlyAndClosingItForgetsIt) {
  const auto [peer, accepted] = connect();
  std::vector<std::byte> scratch(4096);
  auto local = owner->async_map(scratch.data(), scratch.size(), Access::local, asio::use_future).get().value();
  auto mine = reader->async_map(destination.data(), destination.size(), Access::remote_read, asio::use_future).get();
  ASSERT_TRUE(mine) << mine.error().message();
  corma::GetRequest backwards{accepted, local.id, 0, mine.value().effective_addr, 64, mine.value().packed_key};
  auto refused = owner->async_get(backwards, asio::use_future).get();
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::not_configured)) << refused.error().message();
  EXPECT_NE(refused.error().detail.find("the reader connects"), std::string::npos) << refused.error().message();
  auto completed = owner->async_peer_complete(accepted, reader->async_peer_offer(asio::use_future).get().value().blob,
                                              asio::use_future)
                       .get();
  EXPECT_TRUE(completed.error().is(errc::protocol)) << "an accepted peer waits for no answer";

  EXPECT_TRUE(owner->async_peer_close(accepted, asio::use_future).get());
  auto forgotten = owner->async_put(backwards, asio::use_future).get();
  EXPECT_TRUE(forgotten.error().is(errc::peer_unreachable)) << forgotten.error().message();
  // Forgetting it touched nothing of UCX's: the reader's endpoint still reads.
  auto got = read_over(peer);
  EXPECT_TRUE(got) << got.error().message();
  EXPECT_TRUE(owner->async_unmap(local.id, asio::use_future).get());
  EXPECT_TRUE(reader->async_unmap(mine.value().id, asio::use_future).get());
}

TEST_P(UcxHandshake, AnAnswerCompletesOnlyAPendingOffer) {
  auto unknown = reader->async_peer_complete(corma::PeerId{12345}, {}, asio::use_future).get();
  EXPECT_TRUE(unknown.error().is(errc::peer_unreachable)) << unknown.error().message();
  auto offer = reader->async_peer_offer(asio::use_future).get().value();
  // An offer is no answer: refused before UCX sees it.
  auto confused = reader->async_peer_complete(offer.peer, wire::encode_offer(), asio::use_future).get();
  EXPECT_TRUE(confused.error().is(errc::protocol)) << confused.error().message();
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxHandshake, ::testing::ValuesIn(corma::testing::ucx_peer_settings()),
                         corma::testing::UcxSettingName{});

}  // namespace
