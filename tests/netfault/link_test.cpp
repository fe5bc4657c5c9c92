// The fault harness itself: the link between the two namespaces adds the
// round trip its profile asks for, holds some packets back so that they
// arrive out of order, drops what a partition or a loss rule says (and
// nothing once healed), limits the rate, and leaves nothing behind.
#include "netfault/network_pair.hpp"

#include <arpa/inet.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

namespace corma::netfault {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

class Link : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = NetworkPair::unavailable()) GTEST_SKIP() << *why;
  }
};

/// A UDP socket bound in `side`'s namespace, reads timing out after `quiet`.
int udp_bound(const NetworkPair& pair, Side side, std::uint16_t& port, std::chrono::milliseconds quiet) {
  const int fd = pair.socket_in(side, SOCK_DGRAM);
  auto address = socket_address(NetworkPair::address(side), 0);
  socklen_t length = sizeof address;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  port = ntohs(address.sin_port);
  timeval tv{0, static_cast<suseconds_t>(std::chrono::microseconds(quiet).count())};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/// Sends `count` numbered datagrams from `from` to `to`'s side, paced, while
/// a reader takes what arrives until the line goes quiet: the numbers, in
/// arrival order.
std::vector<std::uint32_t> send_datagrams(const NetworkPair& pair, Side from, Side to, std::uint32_t count) {
  std::uint16_t port = 0;
  const int receiver = udp_bound(pair, to, port, 300ms);
  std::vector<std::uint32_t> arrived;
  std::thread reader([&] {
    for (std::uint32_t number = 0; ::recv(receiver, &number, sizeof number, 0) == sizeof number;) {
      arrived.push_back(number);
    }
  });
  const int sender = pair.socket_in(from, SOCK_DGRAM);
  const auto destination = socket_address(NetworkPair::address(to), port);
  for (std::uint32_t i = 0; i < count; ++i) {
    ::sendto(sender, &i, sizeof i, 0, reinterpret_cast<const sockaddr*>(&destination), sizeof destination);
    if (i % 16 == 15) std::this_thread::sleep_for(500us);  // a pace the relay and the reader keep up with
  }
  reader.join();
  ::close(sender);
  ::close(receiver);
  return arrived;
}

/// How long a TCP connect from the consumer's side to `port` on the owner's
/// takes (one round trip), or nullopt when it does not complete in 1 s.
std::optional<steady::duration> connect_time(const NetworkPair& pair, std::uint16_t port) {
  const int fd = pair.socket_in(Side::consumer, SOCK_STREAM);
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds connect()
  const auto to = socket_address(NetworkPair::address(Side::owner), port);
  const auto start = steady::now();
  const bool connected = ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0;
  const auto took = steady::now() - start;
  ::close(fd);
  if (!connected) return std::nullopt;
  return took;
}

TEST_F(Link, TheRoundTripIsTheProfilesAndAPartitionCutsExactlyWhatItSays) {
  NetworkPair pair(LinkProfile{2500us});
  ASSERT_TRUE(pair.ready()) << pair.why_not();
  const int listener = pair.socket_in(Side::owner, SOCK_STREAM);
  auto address = socket_address(NetworkPair::address(Side::owner), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 64), 0);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  const auto port = ntohs(address.sin_port);

  std::vector<steady::duration> round_trips;
  for (int i = 0; i < 7; ++i) {
    auto took = connect_time(pair, port);
    ASSERT_TRUE(took) << "no connection over the healthy link";
    round_trips.push_back(*took);
  }
  std::sort(round_trips.begin(), round_trips.end());
  EXPECT_GE(round_trips.front(), 5ms) << "the link adds 2.5 ms each way";
  EXPECT_LT(round_trips[3], 15ms) << "and not much more";

  ASSERT_TRUE(pair.partition(Cut::both_ways, port));
  EXPECT_FALSE(connect_time(pair, port)) << "the owner's port is cut off";
  EXPECT_EQ(send_datagrams(pair, Side::consumer, Side::owner, 50).size(), 50u) << "only that port";
  ASSERT_TRUE(pair.heal());
  EXPECT_TRUE(connect_time(pair, port)) << "healed";

  ASSERT_TRUE(pair.partition(Cut::to_consumer_only));
  EXPECT_TRUE(send_datagrams(pair, Side::owner, Side::consumer, 50).empty()) << "nothing reaches the consumer";
  EXPECT_EQ(send_datagrams(pair, Side::consumer, Side::owner, 50).size(), 50u) << "everything reaches the owner";
  ASSERT_TRUE(pair.heal());
  ASSERT_TRUE(pair.partition(Cut::to_owner_only));
  EXPECT_TRUE(send_datagrams(pair, Side::consumer, Side::owner, 50).empty());
  EXPECT_EQ(send_datagrams(pair, Side::owner, Side::consumer, 50).size(), 50u);
  ASSERT_TRUE(pair.heal());
  ::close(listener);
}

TEST_F(Link, LossDropsItsShareAndReorderingDeliversEverythingOutOfOrder) {
  NetworkPair lossy(LinkProfile{500us, 0, 1000us, 50});  // 5 % each way
  ASSERT_TRUE(lossy.ready()) << lossy.why_not();
  const auto arrived = send_datagrams(lossy, Side::owner, Side::consumer, 4000).size();
  EXPECT_GT(arrived, 4000u * 90 / 100) << "about 5 % lost";
  EXPECT_LT(arrived, 4000u * 99 / 100) << "about 5 % lost";

  NetworkPair reordering(LinkProfile{500us, 30, 2000us});
  ASSERT_TRUE(reordering.ready()) << reordering.why_not();
  const auto numbers = send_datagrams(reordering, Side::owner, Side::consumer, 500);
  ASSERT_EQ(numbers.size(), 500u) << "reordering loses nothing";
  EXPECT_FALSE(std::is_sorted(numbers.begin(), numbers.end()));
  auto sorted = numbers;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "nor duplicates";
}

TEST_F(Link, ARateLimitBoundsAStream) {
  NetworkPair limited(LinkProfile{500us, 0, 1000us, 0, 100'000'000});  // 100 Mbit/s
  ASSERT_TRUE(limited.ready()) << limited.why_not();
  const auto took = time_tcp_stream(limited, 8u << 20);
  ASSERT_TRUE(took) << "the stream did not arrive whole";
  // 8 MiB at 100 Mbit/s is 0.67 s.
  EXPECT_GT(*took, 550ms);
  EXPECT_LT(*took, 3s);
}

/// Whether process `pid` has entered the named network namespace (`ip netns
/// exec` enters it after the process started).
bool in_namespace(pid_t pid, const std::string& name) {
  struct stat process {}, named {};
  const auto process_ns = "/proc/" + std::to_string(pid) + "/ns/net";
  const auto named_ns = "/run/netns/" + name;
  return ::stat(process_ns.c_str(), &process) == 0 && ::stat(named_ns.c_str(), &named) == 0 &&
         process.st_ino == named.st_ino && process.st_dev == named.st_dev;
}

TEST_F(Link, NothingIsLeftBehind) {
  auto pair = std::make_unique<NetworkPair>(LinkProfile{});
  ASSERT_TRUE(pair->ready()) << pair->why_not();
  const auto owner_namespace = pair->name(Side::owner);
  auto sleeper = pair->start_in(Side::owner, {"/bin/sleep", "600"});
  // Torn down only once it is inside: before, it is nothing of the
  // namespace's to kill (a busy machine takes a while to get it there).
  const auto until = steady::now() + 10s;
  while (!in_namespace(sleeper.pid, owner_namespace) && steady::now() < until) {
    if (sleeper.wait_exit(1ms)) break;
  }
  ASSERT_TRUE(in_namespace(sleeper.pid, owner_namespace)) << "it never ran in the namespace";
  pair.reset();
  EXPECT_TRUE(sleeper.wait_exit(2s)) << "what ran in the namespace was killed with it";
  const auto listed = run_command({tool("ip"), "netns", "list"});
  EXPECT_EQ(listed.output.find(owner_namespace), std::string::npos) << listed.output;
}

}  // namespace
}  // namespace corma::netfault
