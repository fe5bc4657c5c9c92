// The moment UCX 1.13 cannot survive, made on purpose: a target backend
// (trusted tcp) shuts down while its wire-up reply to an initiator is still
// queued, because the initiator's progress thread is busy and has not yet
// accepted the target's connection back. Destroying the target's worker
// then purges that reply, which aborts the process ("got REP message"),
// unless the backend first lets the reply leave (backends/ucx/
// engine_shutdown.cpp). Public headers only; run as a child process by
// tests/programs/shutdown_orders_test.cpp.
//
//   corma-reply-pending RUNS
//
// How the moment is made: the initiator's progress thread is held while its
// first get (which sends the wire-up request) and a busy stretch (a command
// that keeps the thread for `busy` without progressing, as a loaded or
// descheduled reader would) queue up behind it. Released, it sends the
// request and goes busy. The target answers the request on the connection,
// which shows in /proc as bytes the initiator's socket holds unread; the
// target is shut down then, while the initiator is still busy (checked, or
// the attempt is made again with fresh backends). The busy stretch is
// shorter than the quiet time the target waits for its readers.
#include "programs/child.hpp"

#include <corma/ucx.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include <unistd.h>

#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using corma::programs::fail_run;

/// This process's established TCP sockets: for each, the bytes received
/// and not yet read by the process.
std::vector<std::uint64_t> unread_bytes_per_socket() {
  std::set<std::uint64_t> mine;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.starts_with("socket:[")) mine.insert(std::stoull(target.substr(8)));
  }
  std::vector<std::uint64_t> unread;
  std::ifstream in("/proc/self/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    // sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode
    std::istringstream fields(line);
    std::array<std::string, 10> f;
    for (auto& field : f) fields >> field;
    constexpr const char* established = "01";
    if (f[3] != established || !mine.contains(std::stoull(f[9]))) continue;
    unread.push_back(std::stoull(f[4].substr(f[4].find(':') + 1), nullptr, 16));
  }
  return unread;
}

std::shared_ptr<corma::ucx::Backend> make_backend() {
  auto backend = corma::ucx::Backend::create({.transport = corma::ucx::Transport::tcp,
                                              .error_handling = corma::ucx::ErrorHandling::peer,
                                              .operation_timeout = 5s,
                                              .shutdown_timeout = 2s,
                                              .trusted_peers = true,
                                              .tcp_interface = "lo"});
  if (!backend) fail_run("backend: " + backend.error().message());
  return std::move(backend).value();
}

/// How long the initiator stays busy once it has sent its request.
constexpr auto busy = 20ms;

template <class T>
T value_of(std::future<corma::Result<T>> future, const char* what) {
  if (future.wait_for(10s) != std::future_status::ready) fail_run(std::string(what) + ": no answer");
  auto r = future.get();
  if (!r) fail_run(std::string(what) + ": " + r.error().message());
  if constexpr (!std::is_void_v<T>) return std::move(r).value();
}

/// One attempt; whether the target went down with its reply still queued.
bool attempt() {
  auto initiator = make_backend();
  auto target = make_backend();
  auto offer = value_of(initiator->async_peer_offer(asio::use_future), "peer offer");
  auto answer = value_of(target->async_peer_accept(offer.blob, asio::use_future), "peer accept");
  value_of<void>(initiator->async_peer_complete(offer.peer, answer.blob, asio::use_future), "peer complete");
  std::vector<std::byte> remote(4096);
  std::vector<std::byte> local(4096);
  auto exported = value_of(target->async_map(remote.data(), remote.size(), corma::Access::remote_read, asio::use_future),
                           "remote map");
  auto landing = value_of(initiator->async_map(local.data(), local.size(), corma::Access::local, asio::use_future),
                          "local map");
  // The initiator's endpoint connects to the target at once (one socket
  // each side, all read); its wire-up request waits for the first get.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  auto settled = [] {
    const auto unread = unread_bytes_per_socket();
    return unread.size() == 2 && unread[0] == 0 && unread[1] == 0;
  };
  while (!settled()) {
    if (std::chrono::steady_clock::now() > deadline) fail_run("the endpoint never connected");
    std::this_thread::yield();
  }

  std::promise<void> release;
  std::promise<void> held;
  asio::post(initiator->progress_executor(), [&held, released = release.get_future().share()] {
    held.set_value();
    released.wait();
  });
  held.get_future().wait();
  auto got = initiator->async_get({offer.peer, landing.id, 0, reinterpret_cast<std::uint64_t>(remote.data()), 64,
                                   exported.packed_key},
                                  asio::use_future);
  std::atomic<bool> busy_over{false};
  asio::post(initiator->progress_executor(), [&busy_over] {
    const auto until = std::chrono::steady_clock::now() + busy;
    while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
    busy_over.store(true);
  });
  release.set_value();
  // The target answers the request by turning the connection into a two-way
  // one (its reply waits for the initiator to accept that): bytes the busy
  // initiator has not read yet.
  auto answered = [] {
    for (auto bytes : unread_bytes_per_socket()) {
      if (bytes != 0) return true;
    }
    return false;
  };
  bool seen = false;
  while (!(seen = answered()) && !busy_over.load()) {
    if (std::chrono::steady_clock::now() > deadline) fail_run("the initiator never went busy, or never came back");
    std::this_thread::yield();
  }
  // Seen while the initiator is still busy: it has not taken the target's
  // request in, so the reply is queued. (Otherwise this attempt missed the
  // moment, and goes on to its end all the same.)
  const bool reply_queued = seen && !busy_over.load();
  auto target_down = target->async_shutdown(asio::use_future);
  value_of<void>(std::move(target_down), "target shutdown");
  if (got.wait_for(10s) != std::future_status::ready) fail_run("the get was never answered");
  value_of<void>(initiator->async_shutdown(asio::use_future), "initiator shutdown");
  return reply_queued;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::atoi(argv[1]) <= 0) {
    std::fprintf(stderr, "usage: %s RUNS\n", argv[0]);
    return corma::programs::exit_usage;
  }
  const int runs = std::atoi(argv[1]);
  int hit = 0;
  int attempts = 0;
  corma::programs::Watchdog watchdog(std::chrono::seconds(30), [&] {
    return std::to_string(hit) + " of " + std::to_string(runs) + " runs after " + std::to_string(attempts) + " attempts";
  });
  // Every attempt must survive; only those that caught the reply queued
  // count. A loaded machine can keep the moment from being made at all:
  // that is reported apart, so the test says so instead of passing.
  while (hit < runs && attempts < 10 * runs) {
    ++attempts;
    if (attempt()) ++hit;
  }
  if (hit == 0) {
    std::fprintf(stderr, "the reply was never caught queued in %d attempts\n", attempts);
    return corma::programs::exit_not_made;
  }
  std::printf("OK %d of %d runs caught the reply queued (%d attempts)\n", hit, runs, attempts);
  return 0;
}
