// A reader and the backend it reads from, shutting down together: the
// target serves the reader's gets still in flight before it goes (UCX over
// shared memory and tcp serves a get on the target's progress thread), so
// they complete, and neither shutdown waits out its timeout. Before, the
// target went at once: over shared memory the reader then waited its whole
// shutdown timeout for gets nobody would serve, over tcp they failed.
#include "ucx/settings.hpp"

#include <corma/ucx.hpp>

#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <vector>

namespace {

namespace asio = boost::asio;
using corma::Access;
using corma::testing::make_ucx;
using corma::testing::UcxSetting;

class UcxShutdownTogether : public ::testing::TestWithParam<UcxSetting> {};

TEST_P(UcxShutdownTogether, TheReadersGetsCompleteAndNeitherWaitsOutItsTimeout) {
  constexpr std::size_t gets = 16;
  constexpr std::size_t slice = 1 << 20;
  auto config = GetParam().config;
  config.shutdown_timeout = std::chrono::seconds(5);  // the default, spelled out
  auto reader = make_ucx(config);
  auto owner = make_ucx(config);
  auto offer = reader->async_peer_offer(asio::use_future).get().value();
  auto answer = owner->async_peer_accept(offer.blob, asio::use_future).get().value();
  ASSERT_TRUE(reader->async_peer_complete(offer.peer, answer.blob, asio::use_future).get());
  std::vector<std::byte> source(gets * slice);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + 3);
  std::vector<std::byte> landing(source.size());
  auto exported = owner->async_map(source.data(), source.size(), Access::remote_read, asio::use_future).get();
  ASSERT_TRUE(exported) << exported.error().message();
  auto local = reader->async_map(landing.data(), landing.size(), Access::local, asio::use_future).get();
  ASSERT_TRUE(local) << local.error().message();
  auto request = [&](std::size_t i, std::uint64_t len) {
    return corma::GetRequest{offer.peer, local.value().id, i * slice,
                             reinterpret_cast<std::uint64_t>(source.data()) + i * slice, len,
                             exported.value().packed_key};
  };
  // The endpoint is wired up first: what is under test is gets in flight.
  ASSERT_TRUE(reader->async_get(request(0, 64), asio::use_future).get());

  std::vector<std::future<corma::Result<void>>> pending;
  for (std::size_t i = 0; i < gets; ++i) pending.push_back(reader->async_get(request(i, slice), asio::use_future));
  const auto start = std::chrono::steady_clock::now();
  auto reader_down = reader->async_shutdown(asio::use_future);
  auto owner_down = owner->async_shutdown(asio::use_future);
  ASSERT_EQ(reader_down.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(owner_down.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(reader_down.get());
  EXPECT_TRUE(owner_down.get());
  for (std::size_t i = 0; i < gets; ++i) {
    auto got = pending[i].get();
    EXPECT_TRUE(got) << "get " << i << ": " << got.error().message();
  }
  EXPECT_EQ(std::memcmp(landing.data(), source.data(), source.size()), 0);
  EXPECT_LT(took, std::chrono::seconds(2)) << "a shutdown waited out its timeout";
}

INSTANTIATE_TEST_SUITE_P(Ucx, UcxShutdownTogether, ::testing::ValuesIn(corma::testing::ucx_peer_settings()),
                         corma::testing::UcxSettingName{});

}  // namespace
