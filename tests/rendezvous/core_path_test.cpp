// The core path under ordinary use: a chunk read from the socket straight
// into its destination (no copy of corma's, a read buffer kept while frames
// stream and given back when the connection goes quiet), places in a
// consumer's in-flight limit handed over without a lost wake-up, and an
// owner whose look-ups run off its event loop serving every other request
// meanwhile.
#include "rendezvous/rendezvous_fixture.hpp"

#include "rendezvous/consumer/in_flight_limit.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/write.hpp>

#include <cstring>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace {

using namespace corma::testing::rendezvous;
using corma::errc;
using corma::Result;

/// Two ends of one loopback TCP connection, as framed connections.
struct ConnectedPair {
  std::unique_ptr<rv::FramedConnection> writer;
  std::unique_ptr<rv::FramedConnection> reader;

  static asio::awaitable<ConnectedPair> make() {
    auto executor = co_await asio::this_coro::executor;
    asio::ip::tcp::acceptor acceptor(executor, {asio::ip::make_address("127.0.0.1"), 0});
    asio::ip::tcp::socket client(executor);
    co_await client.async_connect(acceptor.local_endpoint(), asio::use_awaitable);
    auto served = co_await acceptor.async_accept(asio::use_awaitable);
    ConnectedPair pair;
    pair.writer = std::make_unique<rv::FramedConnection>(std::move(client), rv::default_max_frame_body);
    pair.reader = std::make_unique<rv::FramedConnection>(std::move(served), rv::default_max_frame_body);
    co_return pair;
  }
};

constexpr auto io_limit = std::chrono::seconds(5);

TEST(FramedConnection, ADataFramesPayloadLandsStraightInTheMemoryItsHeadIsGiven) {
  asio::io_context io;
  const auto payload = pattern(300 * 1024, 9);
  std::vector<std::byte> memory(payload.size());
  std::vector<rv::DataHead> heads;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto pair = co_await ConnectedPair::make();
    const rv::DataLanding landing = [&](const rv::DataHead& head) {
      heads.push_back(head);
      return std::span<std::byte>(memory);
    };
    // Written as an owner writes a chunk (head and bytes gathered in one write).
    EXPECT_TRUE(co_await pair.writer->write_data(7, 4096, payload, io_limit));
    auto frame = co_await pair.reader->read(io_limit, io_limit, &landing);
    EXPECT_TRUE(frame) << frame.error().message();
    if (!frame) co_return;
    EXPECT_EQ(frame.value().request_id, 7U);
    auto* data = std::get_if<rv::Data>(&frame.value().message);
    EXPECT_NE(data, nullptr);
    if (data == nullptr) co_return;
    EXPECT_EQ(data->offset, 4096U);
    EXPECT_EQ(data->landed, payload.size());
    EXPECT_TRUE(data->bytes.empty()) << "the payload was copied into the frame as well";
    // Any other frame is read as ever, landing or not.
    auto pull = message(rv::Pull{3, 0, 10});
    EXPECT_TRUE(co_await pair.writer->write(rv::Frame{8, pull}, io_limit));
    auto other = co_await pair.reader->read(io_limit, io_limit, &landing);
    EXPECT_TRUE(other && std::holds_alternative<rv::Pull>(other.value().message));
  }());
  EXPECT_EQ(memory, payload);
  ASSERT_EQ(heads.size(), 1U) << "the landing was asked about a frame that is not data";
  EXPECT_EQ(heads.front().len, payload.size());
}

TEST(FramedConnection, APayloadWithoutALandingOfItsSizeIsReadIntoTheFrame) {
  asio::io_context io;
  const auto payload = pattern(1000, 3);
  std::vector<std::byte> too_small(999);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto pair = co_await ConnectedPair::make();
    const rv::DataLanding landing = [&](const rv::DataHead&) { return std::span<std::byte>(too_small); };
    EXPECT_TRUE(co_await pair.writer->write_data(1, 0, payload, io_limit));
    auto frame = co_await pair.reader->read(io_limit, io_limit, &landing);
    EXPECT_TRUE(frame);
    auto* data = frame ? std::get_if<rv::Data>(&frame.value().message) : nullptr;
    EXPECT_NE(data, nullptr);
    if (data == nullptr) co_return;
    EXPECT_EQ(data->landed, 0U);
    EXPECT_EQ(data->bytes, payload);
  }());
  EXPECT_EQ(too_small, std::vector<std::byte>(999)) << "memory of the wrong size was written";
}

TEST(FramedConnection, ADataHeadThatDisagreesWithItsFrameIsRefusedBeforeAnyPayloadLands) {
  asio::io_context io;
  std::vector<std::byte> memory(64);
  int asked = 0;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto pair = co_await ConnectedPair::make();
    const rv::DataLanding landing = [&](const rv::DataHead&) {
      ++asked;
      return std::span<std::byte>(memory);
    };
    // A data frame whose length field claims 64 bytes while the frame holds 32.
    auto bytes = rv::encode_frame(rv::Frame{1, rv::Data{0, std::vector<std::byte>(32)}});
    const std::uint32_t claimed = 64;
    std::memcpy(bytes.data() + rv::frame_header_size + 8, &claimed, sizeof claimed);
    co_await asio::async_write(pair.writer->socket(), asio::buffer(bytes), asio::use_awaitable);
    auto frame = co_await pair.reader->read(io_limit, io_limit, &landing);
    EXPECT_FALSE(frame);
    if (!frame) {
      EXPECT_TRUE(frame.error().is(errc::protocol)) << frame.error().message();
    }
    EXPECT_FALSE(pair.reader->is_open()) << "a stream out of step was kept";
  }());
  EXPECT_EQ(asked, 0);
}

TEST(FramedConnection, TheReadBufferIsKeptWhileLargeFramesStreamAndGivenBackWhenTheConnectionGoesQuiet) {
  asio::io_context io;
  const auto large = pattern(512 * 1024, 5);
  std::size_t after_first = 0;
  std::size_t after_second = 0;
  std::size_t after_quiet = 0;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto pair = co_await ConnectedPair::make();
    // Two large frames back to back: the buffer grown for the first serves the second.
    EXPECT_TRUE(co_await pair.writer->write_data(1, 0, large, io_limit));
    EXPECT_TRUE(co_await pair.writer->write_data(2, 0, large, io_limit));
    EXPECT_TRUE(co_await pair.reader->read(io_limit));
    after_first = pair.reader->read_buffer_capacity();
    EXPECT_TRUE(co_await pair.reader->read(io_limit));
    after_second = pair.reader->read_buffer_capacity();
    // Then the connection goes quiet: the next read, begun with nothing
    // buffered, gives the large buffer back before it waits.
    std::optional<Result<rv::Frame>> small;
    asio::co_spawn(co_await asio::this_coro::executor,
                   [&]() -> asio::awaitable<void> { small = co_await pair.reader->read(io_limit); }, asio::detached);
    asio::steady_timer turn(co_await asio::this_coro::executor, std::chrono::milliseconds(1));
    co_await turn.async_wait(asio::use_awaitable);
    auto renew = message(rv::Renew{1});
    EXPECT_TRUE(co_await pair.writer->write(rv::Frame{3, renew}, io_limit));
    while (!small) {
      turn.expires_after(std::chrono::milliseconds(1));
      co_await turn.async_wait(asio::use_awaitable);
    }
    EXPECT_TRUE(*small);
    after_quiet = pair.reader->read_buffer_capacity();
  }());
  EXPECT_GE(after_first, large.size());
  EXPECT_EQ(after_second, after_first) << "the buffer was made anew for the second large frame";
  EXPECT_LE(after_quiet, 64U * 1024U) << "a quiet connection kept its large buffer";
}

// ---- the in-flight limit ------------------------------------------------------

TEST(InFlightLimit, TwoPlacesFreedBeforeEitherWaiterRunsGoToTwoWaiters) {
  asio::io_context io;
  corma::rendezvous::InFlightLimit limit(io.get_executor(), 2);
  std::vector<std::optional<corma::rendezvous::InFlightLimit::Place>> held(2);
  int entered_later = 0;
  std::vector<std::optional<corma::rendezvous::InFlightLimit::Place>> later(2);
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    for (auto& place : held) place.emplace((co_await limit.enter()).value());
    for (auto& place : later) {
      asio::co_spawn(io, [&]() -> asio::awaitable<void> {
        auto entered = co_await limit.enter();
        if (entered) {
          ++entered_later;
          place.emplace(std::move(entered).value());
        }
      }, asio::detached);
    }
    asio::steady_timer turn(io, std::chrono::milliseconds(1));
    co_await turn.async_wait(asio::use_awaitable);
    EXPECT_EQ(entered_later, 0);
    // Both places go in one handler, before either waiter runs.
    held[0].reset();
    held[1].reset();
    co_await until([&] { return entered_later == 2; }, std::chrono::seconds(5));
  }());
  EXPECT_EQ(entered_later, 2) << "a place freed was left unused while a fetch waited";
  EXPECT_EQ(limit.in_flight(), 2U);
}

// ---- look-ups off the owner's loop ----------------------------------------------

/// An async resolver that holds each look-up until the test answers it,
/// from a thread of its own (as a file reader would).
struct HeldResolver {
  std::mutex mutex;
  std::vector<std::pair<std::string, corma::ResolveHandler>> held;

  corma::AsyncObjectResolver resolver() {
    return [this](std::string name, corma::ResolveHandler done) {
      std::lock_guard lock(mutex);
      held.emplace_back(std::move(name), std::move(done));
    };
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return held.size();
  }
  /// Answers every look-up held, from another thread.
  void answer_all(const std::function<Result<corma::PublishedObject>(const std::string&)>& find) {
    std::vector<std::pair<std::string, corma::ResolveHandler>> taken;
    {
      std::lock_guard lock(mutex);
      taken.swap(held);
    }
    std::thread([&] {
      for (auto& [name, done] : taken) std::move(done)(find(name));
    }).join();
  }
};

TEST_F(Rendezvous, AnOwnerServesEveryOtherRequestWhileALookUpRunsOffItsLoop) {
  start_owner();
  HeldResolver files;
  owner->set_resolver(files.resolver());
  const auto slow = pattern(200 * 1024, 6);
  std::optional<Result<corma::Fetched>> slow_fetch;
  std::optional<Result<corma::Fetched>> missing;
  int published_fetched_meanwhile = 0;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto waiting = (co_await connect(nullptr)).value();
    auto other = (co_await connect(nullptr)).value();
    asio::co_spawn(io, [&]() -> asio::awaitable<void> { slow_fetch = co_await waiting->async_fetch("slow.bin"); },
                   asio::detached);
    asio::co_spawn(io, [&]() -> asio::awaitable<void> { missing = co_await waiting->async_fetch("gone.bin"); },
                   asio::detached);
    co_await until([&] { return files.count() == 2; }, std::chrono::seconds(5));
    EXPECT_EQ(files.count(), 2U) << "the look-ups never reached the resolver";
    // Both look-ups are held: the owner goes on serving the other consumer.
    for (int i = 0; i < 20; ++i) {
      auto fetched = co_await other->async_fetch("small");
      if (fetched && fetched.value().data.size() == small.size()) ++published_fetched_meanwhile;
    }
    EXPECT_EQ(owner->stats().live_leases, 0U);
    EXPECT_FALSE(slow_fetch.has_value());
    files.answer_all([&](const std::string& name) -> Result<corma::PublishedObject> {
      if (name == "slow.bin") return corma::PublishedObject{slow, nullptr};
      return corma::fail(errc::region_not_found, "no such file");
    });
    co_await until([&] { return slow_fetch.has_value() && missing.has_value(); }, std::chrono::seconds(5));
  }());
  EXPECT_EQ(published_fetched_meanwhile, 20);
  ASSERT_TRUE(slow_fetch.has_value());
  ASSERT_TRUE(*slow_fetch) << slow_fetch->error().message();
  EXPECT_EQ(std::vector<std::byte>(slow_fetch->value().data.bytes().begin(), slow_fetch->value().data.bytes().end()),
            slow);
  ASSERT_TRUE(missing.has_value());
  ASSERT_FALSE(*missing);
  EXPECT_TRUE(missing->error().is(errc::region_not_found)) << missing->error().message();
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

TEST_F(Rendezvous, AnAnswerSlowerThanTheIoTimeoutIsWaitedForWhileTheOwnerAnswersHeartbeats) {
  // The look-up (a large registration, a cold file) takes several io
  // timeouts: the owner is alive and says so, so the connection is kept.
  start_owner();
  HeldResolver files;
  owner->set_resolver(files.resolver());
  const auto slow = pattern(5000, 7);
  corma::ConsumerConfig config;
  config.io_timeout = std::chrono::milliseconds(100);
  std::optional<Result<corma::Fetched>> slow_fetch;
  std::optional<Result<corma::Fetched>> after;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto consumer = (co_await corma::Consumer::connect(io.get_executor(), acceptor.local_endpoint(), nullptr, config)).value();
    asio::co_spawn(io, [&]() -> asio::awaitable<void> { slow_fetch = co_await consumer->async_fetch("slow.bin"); },
                   asio::detached);
    // Three heartbeats asked whether the owner lived: three io timeouts passed.
    co_await until([&] { return owner->stats().heartbeats >= 3; }, std::chrono::seconds(5));
    EXPECT_GE(owner->stats().heartbeats, 3U);
    EXPECT_FALSE(slow_fetch.has_value()) << "the slow fetch ended before its answer";
    files.answer_all([&](const std::string&) -> Result<corma::PublishedObject> {
      return corma::PublishedObject{slow, nullptr};
    });
    co_await until([&] { return slow_fetch.has_value(); }, std::chrono::seconds(5));
    after = co_await consumer->async_fetch("small");
  }());
  ASSERT_TRUE(slow_fetch.has_value());
  ASSERT_TRUE(*slow_fetch) << slow_fetch->error().message();
  EXPECT_EQ(slow_fetch->value().data.size(), slow.size());
  ASSERT_TRUE(after.has_value());
  EXPECT_TRUE(*after) << "the connection was given up: " << after->error().message();
}

TEST_F(Rendezvous, ALookUpIsGivenUpWhenTheConnectionThatAskedForItGoes) {
  // A cold file being read for a consumer that went away must not go on
  // being read (nor hold the connection's end) until the read is done: the
  // resolver's handler is cancelled when the connection ends.
  start_owner();
  HeldLookUps lookups;
  owner->set_resolver(lookups.resolver());
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello_request = corma::testing::message(corma::rendezvous::Hello{});
    auto hello = co_await client.ask(std::move(hello_request));
    EXPECT_TRUE(hello && std::holds_alternative<corma::rendezvous::HelloOk>(hello.value()));
    const corma::rendezvous::Frame acquire{client.next++, corma::rendezvous::Message(corma::rendezvous::Acquire{"cold.bin", false})};
    auto written = co_await client.connection->write(acquire, std::chrono::seconds(5));
    EXPECT_TRUE(written);
    co_await until([&] { return lookups.asked() == 1; }, std::chrono::seconds(5));
    EXPECT_EQ(lookups.asked(), 1U) << "the look-up never reached the resolver";
    client.connection->close();
    co_await until([&] { return lookups.given_up() == 1 && owner->stats().open_connections == 0; },
                   std::chrono::seconds(5));
  }());
  EXPECT_EQ(lookups.given_up(), 1U) << "the look-up went on after its connection went";
  EXPECT_EQ(owner->stats().open_connections, 0U) << "the session waited for a look-up nobody wanted";
  EXPECT_EQ(owner->stats().live_leases, 0U);
}

/// CPU time this thread has used.
std::chrono::microseconds thread_cpu() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  return std::chrono::seconds(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         std::chrono::microseconds(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

TEST_F(Rendezvous, AnOwnerOutOfDescriptorsWaitsToAcceptInsteadOfSpinningAndServesOnceItHasThem) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers' runtimes open descriptors of their own (their checks
  // read /proc/self/maps), and fail falsely in a process that has none left.
  GTEST_SKIP() << "takes every descriptor of the process, which a sanitizer runtime needs for itself";
#endif
  start_owner();
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  int highest = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    highest = std::max(highest, std::stoi(entry.path().filename().string()));
  }
  asio::ip::tcp::socket client(io);
  client.open(asio::ip::tcp::v4());
  // Every descriptor this process may have is taken: the owner's accepts fail.
  rlimit lowered = original;
  lowered.rlim_cur = static_cast<rlim_t>(highest + 16);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::vector<int> fillers;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  client.connect(acceptor.local_endpoint());  // into the backlog; the accept has no descriptor for it
  const auto cpu_before = thread_cpu();
  io.restart();
  io.run_for(std::chrono::milliseconds(300));
  const auto cpu_spent = thread_cpu() - cpu_before;
  for (int fd : fillers) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &original);
  EXPECT_LT(cpu_spent, std::chrono::milliseconds(100)) << "the owner spun on failing accepts";
  // With descriptors again, the waiting connection is taken and served.
  std::optional<Result<rv::Message>> greeted;
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    RawClient raw;
    raw.connection = std::make_unique<rv::FramedConnection>(std::move(client), rv::default_max_frame_body);
    auto hello = message(rv::Hello{rv::protocol_version, corma::BackendId{}, {}});
    greeted = co_await raw.ask(std::move(hello));
  }());
  ASSERT_TRUE(greeted.has_value());
  EXPECT_TRUE(*greeted && std::holds_alternative<rv::HelloOk>(greeted->value()));
}

}  // namespace
