// The owner's proof (protocol version 6): a consumer holding the cluster key
// reaches an owner that proves it holds the key and is the owner expected,
// and only then offers RDMA; an owner without the key, with another key,
// under another id, or replaying a proof made for another challenge is
// refused (`not_owned`) before any offer leaves the consumer. Consumers
// without a key are served as before, and the owner answers a challenge it
// cannot meet, or one after the hello, as the protocol says.
#include "rendezvous/rendezvous_fixture.hpp"

#include "rendezvous/protocol/owner_proof.hpp"

#include <cstring>

namespace corma::testing::rendezvous {
namespace {

const std::string cluster_key = "a cluster key of thirty-two byte";
const std::string other_key = "another key, also thirty-two byt";

class OwnerProof : public Rendezvous {
 protected:
  static corma::OwnerConfig keyed(std::string key, std::string id) {
    corma::OwnerConfig config;
    config.cluster_key = std::move(key);
    config.owner_id = std::move(id);
    return config;
  }

  corma::Result<std::unique_ptr<Consumer>> connect_with(std::string key, std::string expected,
                                                        asio::ip::tcp::endpoint to) {
    corma::ConsumerConfig config;
    config.cluster_key = std::move(key);
    config.expected_owner = std::move(expected);
    return corma::testing::run(io, Consumer::connect(io.get_executor(), to, consumer_registry, config));
  }
  corma::Result<std::unique_ptr<Consumer>> connect_with(std::string key, std::string expected) {
    return connect_with(std::move(key), std::move(expected), acceptor.local_endpoint());
  }
};

TEST_F(OwnerProof, AnOwnerThatProvesTheKeyAndItsIdIsReachedAndOnlyThenOfferedRdma) {
  start_owner(64 << 20, keyed(cluster_key, "owner-a"));
  auto consumer = connect_with(cluster_key, "owner-a");
  ASSERT_TRUE(consumer) << consumer.error().message();
  EXPECT_EQ(consumer.value()->proven_owner(), "owner-a");
  EXPECT_TRUE(consumer.value()->rdma_ready()) << "the offer follows the proof";
  EXPECT_EQ(consumer.value()->protocol_version(), rv::proof_protocol_version);
  auto fetched = corma::testing::run(io, consumer.value()->async_fetch("big"));
  ASSERT_TRUE(fetched) << fetched.error().message();
  EXPECT_EQ(fetched.value().path, Path::rdma);
  ASSERT_EQ(fetched.value().data.size(), big.size());
  EXPECT_EQ(std::memcmp(fetched.value().data.data(), big.data(), big.size()), 0);

  // Any id holding the key, when none is expected.
  auto any = connect_with(cluster_key, "");
  ASSERT_TRUE(any) << any.error().message();
  EXPECT_EQ(any.value()->proven_owner(), "owner-a");
}

TEST_F(OwnerProof, AnOwnerWithoutTheKeyWithAnotherKeyOrUnderAnotherIdIsRefusedBeforeAnyOffer) {
  for (const auto& [what, config] : {std::pair{"no key", corma::OwnerConfig{}},
                                     std::pair{"another key", keyed(other_key, "owner-a")},
                                     std::pair{"another id", keyed(cluster_key, "owner-b")}}) {
    start_owner(64 << 20, config);
    const auto peers_before = consumer_backend->open_peers();
    const auto offers_before = owner_backend->open_peers();
    auto consumer = connect_with(cluster_key, "owner-a");
    ASSERT_FALSE(consumer) << what;
    EXPECT_TRUE(consumer.error().is(errc::not_owned)) << what << ": " << consumer.error().message();
    EXPECT_NE(consumer.error().message().find("owner-a"), std::string::npos) << consumer.error().message();
    EXPECT_EQ(consumer_backend->open_peers(), peers_before) << what << ": an offer was made";
    EXPECT_EQ(owner_backend->open_peers(), offers_before) << what << ": the owner took an offer";
    owner->stop();
    io.run_for(std::chrono::milliseconds(50));
  }
}

TEST_F(OwnerProof, AProofMadeForAnotherChallengeIsRefused) {
  // An impostor that recorded a real proof (the right key's MAC, the right
  // id, its own address) answers every challenge with it.
  asio::ip::tcp::acceptor impostor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto recorded_challenge = rv::fresh_challenge().value();
  const auto key_bytes = std::as_bytes(std::span{cluster_key.data(), cluster_key.size()});
  const rv::Proof recorded{"owner-a", rv::owner_proof_mac(key_bytes, recorded_challenge, "owner-a",
                                                          rv::proof_endpoint(impostor.local_endpoint()))
                                          .value()};
  bool answered = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto socket = co_await impostor.async_accept(asio::use_awaitable);
        rv::FramedConnection connection(std::move(socket), rv::default_max_frame_body);
        auto prove = co_await connection.read(std::chrono::seconds(5));
        if (!prove || !std::holds_alternative<rv::Prove>(prove.value().message)) co_return;
        rv::Frame replay{prove.value().request_id, recorded};
        answered = static_cast<bool>(co_await connection.write(replay, std::chrono::seconds(5)));
        (void)co_await connection.read(std::chrono::seconds(5));  // until the consumer hangs up
      },
      asio::detached);
  auto consumer = connect_with(cluster_key, "owner-a", impostor.local_endpoint());
  EXPECT_TRUE(answered);
  ASSERT_FALSE(consumer);
  EXPECT_TRUE(consumer.error().is(errc::not_owned)) << consumer.error().message();
  EXPECT_EQ(consumer_backend->open_peers(), 0u) << "an offer went to the impostor";
}

TEST_F(OwnerProof, AChallengeRelayedToTheRealOwnerYieldsAProofForItsAddressWhichIsRefusedAtTheImpostors) {
  // Whoever can write to etcd points owner-a's entry at itself and relays
  // each challenge to the real owner-a, which answers it: the proof is for
  // the address the real owner was reached at, not the one the consumer
  // dialled.
  start_owner(64 << 20, keyed(cluster_key, "owner-a"));
  asio::ip::tcp::acceptor impostor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  bool relayed = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto socket = co_await impostor.async_accept(asio::use_awaitable);
        rv::FramedConnection consumer_side(std::move(socket), rv::default_max_frame_body);
        auto prove = co_await consumer_side.read(std::chrono::seconds(5));
        if (!prove || !std::holds_alternative<rv::Prove>(prove.value().message)) co_return;
        auto real = co_await RawClient::connect(acceptor.local_endpoint());
        auto proof = co_await real.ask(message(std::get<rv::Prove>(prove.value().message)));
        if (!proof || !std::holds_alternative<rv::Proof>(proof.value())) co_return;
        rv::Frame relay{prove.value().request_id, std::move(proof.value())};
        relayed = static_cast<bool>(co_await consumer_side.write(relay, std::chrono::seconds(5)));
        (void)co_await consumer_side.read(std::chrono::seconds(5));
      },
      asio::detached);
  auto consumer = connect_with(cluster_key, "owner-a", impostor.local_endpoint());
  EXPECT_TRUE(relayed) << "the real owner did not answer the relayed challenge";
  ASSERT_FALSE(consumer);
  EXPECT_TRUE(consumer.error().is(errc::not_owned)) << consumer.error().message();
  EXPECT_EQ(consumer_backend->open_peers(), 0u) << "an offer went to the impostor";
}

TEST(OwnerProofMac, IsBoundToTheKeyTheChallengeTheIdAndTheEndpoint) {
  const auto challenge = rv::fresh_challenge().value();
  EXPECT_NE(challenge, rv::fresh_challenge().value()) << "two challenges alike";
  const auto key = std::as_bytes(std::span{cluster_key.data(), cluster_key.size()});
  const auto other = std::as_bytes(std::span{other_key.data(), other_key.size()});
  const rv::Proof proof{"owner-a", rv::owner_proof_mac(key, challenge, "owner-a", "10.0.0.1:7300").value()};
  EXPECT_TRUE(rv::proof_holds(key, challenge, proof, "10.0.0.1:7300"));
  EXPECT_FALSE(rv::proof_holds(other, challenge, proof, "10.0.0.1:7300"));
  EXPECT_FALSE(rv::proof_holds(key, rv::fresh_challenge().value(), proof, "10.0.0.1:7300"));
  EXPECT_FALSE(rv::proof_holds(key, challenge, rv::Proof{"owner-b", proof.mac}, "10.0.0.1:7300"));
  EXPECT_FALSE(rv::proof_holds(key, challenge, proof, "10.0.0.2:7300"));
  EXPECT_FALSE(rv::proof_holds(key, challenge, rv::Proof{"owner-a", {}}, "10.0.0.1:7300")) << "zeros";
  // An owner on a dual-stack socket sees an IPv4 consumer at a mapped address.
  EXPECT_EQ(rv::proof_endpoint({asio::ip::make_address("::ffff:10.0.0.1"), 7300}), "10.0.0.1:7300");
  EXPECT_EQ(rv::proof_endpoint({asio::ip::make_address("10.0.0.1"), 7300}), "10.0.0.1:7300");
}

TEST_F(OwnerProof, AKeyedOwnerServesConsumersWithoutAKeyAsBefore) {
  start_owner(64 << 20, keyed(cluster_key, "owner-a"));
  auto consumer = connect_with("", "");
  ASSERT_TRUE(consumer) << consumer.error().message();
  EXPECT_TRUE(consumer.value()->proven_owner().empty());
  auto fetched = corma::testing::run(io, consumer.value()->async_fetch("small"));
  ASSERT_TRUE(fetched) << fetched.error().message();
  ASSERT_EQ(fetched.value().data.size(), small.size());
  EXPECT_EQ(std::memcmp(fetched.value().data.data(), small.data(), small.size()), 0);
}

TEST_F(OwnerProof, AConsumerKeyTooShortOrAnOlderVersionIsAConfigurationError) {
  start_owner(64 << 20, keyed(cluster_key, "owner-a"));
  auto short_key = connect_with("fifteen bytes!!", "owner-a");
  ASSERT_FALSE(short_key);
  EXPECT_TRUE(short_key.error().is(errc::not_configured)) << short_key.error().message();
  corma::ConsumerConfig older;
  older.cluster_key = cluster_key;
  older.protocol_version = rv::generation_protocol_version;
  auto old = corma::testing::run(
      io, Consumer::connect(io.get_executor(), acceptor.local_endpoint(), consumer_registry, older));
  ASSERT_FALSE(old);
  EXPECT_TRUE(old.error().is(errc::not_configured)) << old.error().message();
}

TEST_F(OwnerProof, AChallengeTheOwnerCannotMeetOrOneAfterTheHelloIsRefused) {
  start_owner();  // no key
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto refused = co_await client.ask(message(rv::Prove{}));
    EXPECT_TRUE(is_error(refused, errc::not_owned));
    auto after = co_await client.ask(message(rv::Hello{}));
    EXPECT_FALSE(after) << "the connection stays open after a refused challenge";
  }());
  owner->stop();
  io.run_for(std::chrono::milliseconds(50));
  start_owner(64 << 20, keyed(cluster_key, "owner-a"));
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello = co_await client.ask(message(rv::Hello{}));
    EXPECT_TRUE(hello && std::holds_alternative<rv::HelloOk>(hello.value()));
    auto late = co_await client.ask(message(rv::Prove{}));
    EXPECT_TRUE(is_error(late, errc::protocol)) << "a challenge after the hello is not the protocol";
  }());
}

}  // namespace
}  // namespace corma::testing::rendezvous
