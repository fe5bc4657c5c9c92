// The UCX backend beyond the shared contract: configuration, trust, wire
// records, idle CPU.
#include "support/run.hpp"
#include "ucx/settings.hpp"

#include <corma/ucx.hpp>

#include "wire.hpp"

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <random>
#include <thread>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::errc;
namespace ucx = corma::ucx;
namespace wire = corma::ucx::wire;

using corma::testing::make_ucx;

TEST(UcxConfig, SharedMemoryWithPeerErrorHandlingIsRefused) {
  auto backend = ucx::Backend::create({.transport = ucx::Transport::shared_memory,
                                       .error_handling = ucx::ErrorHandling::peer});
  ASSERT_FALSE(backend);
  EXPECT_TRUE(backend.error().is(errc::not_configured)) << backend.error().message();
}

TEST(UcxConfig, TcpInterfaceIsOneExistingDevice) {
  for (const char* list : {"lo,eth0", "all"}) {
    auto backend =
        ucx::Backend::create({.transport = ucx::Transport::tcp, .trusted_peers = true, .tcp_interface = list});
    ASSERT_FALSE(backend) << list;
    EXPECT_TRUE(backend.error().is(errc::not_configured)) << backend.error().message();
  }
  auto missing = ucx::Backend::create({.transport = ucx::Transport::tcp, .trusted_peers = true,
                                       .tcp_interface = "nosuchdev0"});
  ASSERT_FALSE(missing);
  EXPECT_TRUE(missing.error().is(errc::not_configured)) << missing.error().message();
  auto loopback =
      ucx::Backend::create({.transport = ucx::Transport::tcp, .trusted_peers = true, .tcp_interface = "lo"});
  EXPECT_TRUE(loopback) << loopback.error().message();
}

TEST(UcxTrust, TcpWithoutTrustedPeersExposesNothing) {
  auto backend = make_ucx({.transport = ucx::Transport::tcp});
  EXPECT_FALSE(backend->rma_enabled());
  std::vector<std::byte> memory(4096);
  auto exported = backend->async_map(memory.data(), memory.size(), Access::remote_read, asio::use_future).get();
  ASSERT_FALSE(exported);
  EXPECT_TRUE(exported.error().is(errc::not_configured)) << exported.error().message();
  // Local registrations (a destination for the chunked path) still work.
  auto local = backend->async_map(memory.data(), memory.size(), Access::local, asio::use_future).get();
  ASSERT_TRUE(local) << local.error().message();
  EXPECT_TRUE(local.value().packed_key.empty());
  EXPECT_EQ(backend->live_registrations(), 1u);
  EXPECT_TRUE(backend->async_unmap(local.value().id, asio::use_future).get());
  EXPECT_EQ(backend->live_registrations(), 0u);
  // No peers either way: the rendezvous layer then offers and accepts none.
  auto offer = backend->async_peer_offer(asio::use_future).get();
  ASSERT_FALSE(offer);
  EXPECT_TRUE(offer.error().is(errc::not_configured)) << offer.error().message();
  auto answer = backend->async_peer_accept(wire::encode_offer(), asio::use_future).get();
  ASSERT_FALSE(answer);
  EXPECT_TRUE(answer.error().is(errc::not_configured)) << answer.error().message();
}

TEST(UcxTrust, SharedMemoryExposesWithoutTheSetting) {
  auto backend = make_ucx({.transport = ucx::Transport::shared_memory, .error_handling = ucx::ErrorHandling::none});
  EXPECT_TRUE(backend->rma_enabled());
}

TEST(UcxWire, KeysRoundTripAndEveryCorruptionIsRefused) {
  const std::vector<std::byte> rkey = {std::byte{1}, {}, {}, {}, {}, {}, {}, {}, {}, {}};  // md 0, host, one empty record
  const auto key = wire::encode_key(0x1000, 4096, corma::Access::remote_atomic, rkey);
  auto decoded = wire::decode_key(key, 1);
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_EQ(decoded.value().addr, 0x1000u);
  EXPECT_EQ(decoded.value().len, 4096u);
  EXPECT_EQ(decoded.value().access, corma::Access::remote_atomic);
  EXPECT_FALSE(wire::decode_key(wire::encode_key(0x1000, 4096, corma::Access::local, rkey), 1))
      << "a key must name remote access";
  EXPECT_EQ(decoded.value().rkey_size, rkey.size());
  EXPECT_GE(decoded.value().rkey.size(), rkey.size() + 4096) << "rkey copy must be padded";

  for (std::size_t i = 0; i < key.size(); ++i) {
    for (auto flip : {std::byte{0x01}, std::byte{0x80}}) {
      auto bad = key;
      bad[i] ^= flip;
      auto r = wire::decode_key(bad, 1);
      EXPECT_FALSE(r) << "flipping byte " << i << " went unnoticed";
      if (!r) {
        EXPECT_TRUE(r.error().is(errc::invalid_key));
      }
    }
  }
  EXPECT_FALSE(wire::decode_key({}, 1));
  EXPECT_FALSE(wire::decode_key(corma::PackedKey(key.begin(), key.begin() + 20), 1));
  EXPECT_FALSE(wire::decode_key(corma::PackedKey(corma::max_packed_key_size + 1), 1));
  auto trailing = key;
  trailing.push_back(std::byte{0});
  EXPECT_FALSE(wire::decode_key(trailing, 1));
  EXPECT_FALSE(wire::decode_key(key, 2)) << "a memory domain this worker lacks";

  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i) {
    corma::PackedKey noise(1 + rng() % 96);
    for (auto& b : noise) b = static_cast<std::byte>(rng());
    EXPECT_FALSE(wire::decode_key(noise, ~std::uint64_t{0}));
  }
}

TEST(UcxWire, RkeyStructureMustBeExact) {
  using B = std::byte;
  EXPECT_TRUE(wire::check_rkey_structure(std::vector<B>{B{1}, {}, {}, {}, {}, {}, {}, {}, {}, {}}));
  EXPECT_TRUE(wire::check_rkey_structure(std::vector<B>{B{3}, {}, {}, {}, {}, {}, {}, {}, {}, B{1}, B{9}, {}}));
  EXPECT_FALSE(wire::check_rkey_structure(std::vector<B>{B{3}, {}, {}, {}, {}, {}, {}, {}, {}, B{1}, B{9}}));
  EXPECT_FALSE(wire::check_rkey_structure(std::vector<B>{B{1}, {}, {}, {}, {}, {}, {}, {}, B{1}, {}}));
  EXPECT_FALSE(wire::check_rkey_structure(std::vector<B>{{}, {}, {}, {}, {}, {}, {}, {}, {}}));
}

TEST(UcxWire, AddressBlobsAreFramedWithTheirNotificationToken) {
  const std::vector<std::byte> address(79, std::byte{0x42});
  auto blob = wire::encode_address(0x1122334455667788ULL, address);
  auto decoded = wire::decode_address(blob);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded.value().token, 0x1122334455667788ULL);
  EXPECT_TRUE(std::equal(address.begin(), address.end(), decoded.value().address.begin()));
  blob.pop_back();
  EXPECT_TRUE(wire::decode_address(blob).error().is(errc::protocol));
  EXPECT_TRUE(wire::decode_address({}).error().is(errc::protocol));
  EXPECT_TRUE(wire::decode_address(std::vector<std::byte>(corma::max_peer_blob_size + 1)).error().is(errc::protocol));
}

TEST(UcxWire, NotificationHeadersAndAcknowledgementsAreExact) {
  const wire::NotifyHeader header{1, 2, 3};
  auto bytes = wire::encode_notify(header);
  ASSERT_EQ(bytes.size(), 24u);
  auto decoded = wire::decode_notify(bytes);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded.value().token, 1u);
  EXPECT_EQ(decoded.value().tag, 2u);
  EXPECT_EQ(decoded.value().sequence, 3u);
  bytes.push_back(std::byte{0});
  EXPECT_TRUE(wire::decode_notify(bytes).error().is(errc::protocol));
  EXPECT_TRUE(wire::decode_notify({}).error().is(errc::protocol));

  auto ack = wire::encode_ack({9, static_cast<std::uint64_t>(wire::NotifyStatus::queue_full)});
  ASSERT_EQ(ack.size(), 16u);
  EXPECT_EQ(wire::decode_ack(ack).value().status, static_cast<std::uint64_t>(wire::NotifyStatus::queue_full));
  auto unknown = wire::encode_ack({9, 77});
  EXPECT_TRUE(wire::decode_ack(unknown).error().is(errc::protocol));
  ack.pop_back();
  EXPECT_TRUE(wire::decode_ack(ack).error().is(errc::protocol));
}

TEST(UcxWire, OffersAreExactlyMagicAndVersion) {
  const auto offer = wire::encode_offer();
  const std::vector<std::byte> expected = {std::byte{0x43}, std::byte{0x55}, std::byte{0x4F}, std::byte{0x31},
                                           std::byte{1}};  // "CUO1", version 1
  EXPECT_EQ(offer, expected);
  EXPECT_TRUE(wire::decode_offer(offer));
  for (std::size_t i = 0; i < offer.size(); ++i) {
    auto bad = offer;
    bad[i] ^= std::byte{0x01};
    EXPECT_TRUE(wire::decode_offer(bad).error().is(errc::protocol)) << "byte " << i;
    EXPECT_TRUE(wire::decode_offer({offer.begin(), offer.begin() + static_cast<long>(i)}).error().is(errc::protocol))
        << "truncated to " << i;
  }
  auto trailing = offer;
  trailing.push_back(std::byte{0});
  EXPECT_TRUE(wire::decode_offer(trailing).error().is(errc::protocol));
  EXPECT_TRUE(wire::decode_offer(std::vector<std::byte>(corma::max_peer_blob_size + 1)).error().is(errc::protocol));
  auto address = wire::decode_offer(wire::encode_address(5, std::vector<std::byte>(79, std::byte{0x42})));
  ASSERT_FALSE(address);
  EXPECT_NE(address.error().detail.find("worker address"), std::string::npos) << address.error().message();
}

class UcxRoundTrip : public ::testing::TestWithParam<corma::testing::UcxSetting> {};

TEST_P(UcxRoundTrip, GetAndPutBetweenTwoWorkers) {
  auto initiator = make_ucx(GetParam().config);
  auto target = make_ucx(GetParam().config);
  auto offer = initiator->async_peer_offer(asio::use_future).get().value();
  auto answer = target->async_peer_accept(offer.blob, asio::use_future).get();
  ASSERT_TRUE(answer) << answer.error().message();
  ASSERT_TRUE(initiator->async_peer_complete(offer.peer, answer.value().blob, asio::use_future).get());

  const std::size_t size = 1 << 20;
  std::vector<std::byte> source(size), destination(size);
  for (std::size_t i = 0; i < size; ++i) source[i] = static_cast<std::byte>(i * 7 + 3);
  auto remote = target->async_map(source.data(), size, Access::remote_read_write, asio::use_future).get();
  ASSERT_TRUE(remote) << remote.error().message();
  auto local = initiator->async_map(destination.data(), size, Access::local, asio::use_future).get().value();

  corma::GetRequest get{offer.peer, local.id, 0, remote.value().effective_addr, size, remote.value().packed_key};
  auto got = initiator->async_get(get, asio::use_future).get();
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(source, destination);

  destination[10] = std::byte{0xEE};
  corma::PutRequest put{offer.peer, local.id, 10, remote.value().effective_addr + 99, 1, remote.value().packed_key};
  auto put_done = initiator->async_put(put, asio::use_future).get();
  ASSERT_TRUE(put_done) << put_done.error().message();
  EXPECT_EQ(source[99], std::byte{0xEE});
  EXPECT_EQ(initiator->transfers_in_flight(), 0u);

  EXPECT_TRUE(initiator->async_shutdown(asio::use_future).get());
  EXPECT_TRUE(target->async_shutdown(asio::use_future).get());
  EXPECT_EQ(initiator->live_registrations(), 0u);
  EXPECT_EQ(target->live_registrations(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxRoundTrip, ::testing::ValuesIn(corma::testing::ucx_peer_settings()),
                         corma::testing::UcxSettingName{});

double idle_cpu_fraction(ucx::ProgressMode mode) {
  // A worker with a tcp interface (trusted, loopback): one that has sockets to watch.
  auto backend = make_ucx({.transport = ucx::Transport::tcp, .progress = mode, .trusted_peers = true,
                           .tcp_interface = "lo"});
  // One round trip, so the worker has been active and then falls idle.
  std::vector<std::byte> memory(4096);
  auto region = backend->async_map(memory.data(), memory.size(), Access::local, asio::use_future).get();
  EXPECT_TRUE(region);
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  const auto start = std::chrono::steady_clock::now();
  // The measurement window itself, not a synchronisation.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ::getrusage(RUSAGE_SELF, &after);
  const auto wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto seconds = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
  };
  return (seconds(after) - seconds(before)) / wall;
}

TEST(UcxIdleCpu, AdaptiveAndEventModesSleep) {
  const double adaptive = idle_cpu_fraction(ucx::ProgressMode::adaptive);
  const double event = idle_cpu_fraction(ucx::ProgressMode::event);
  std::printf("idle progress thread: adaptive %.3f%% of a core, event %.3f%% of a core\n", adaptive * 100,
              event * 100);
  EXPECT_LT(adaptive, 0.01);
  EXPECT_LT(event, 0.01);
}

}  // namespace
