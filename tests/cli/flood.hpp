// Tools for tests that load a separate `corma serve`: its port and metrics,
// its memory and CPU, connections that pipeline requests (and drain or
// ignore the answers), and a newcomer's `corma get` run again and again
// meanwhile, timed from process start to exit.
#pragma once

#include "cli/processes.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <sys/resource.h>

#include <array>
#include <atomic>
#include <cstring>
#include <random>
#include <deque>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>

namespace corma::cli::testing {

inline std::vector<char> random_bytes(std::size_t size, unsigned seed) {
  std::vector<char> bytes(size);
  std::mt19937_64 rng(seed);
  for (std::size_t at = 0; at < size; at += 8) {
    const auto word = rng();
    std::memcpy(bytes.data() + at, &word, std::min<std::size_t>(8, size - at));
  }
  return bytes;
}

/// The port of the address a server printed after `marker`.
inline unsigned short port_of(const Process& server, const std::string& marker) {
  return static_cast<unsigned short>(std::stoi(port_after(server.captured, marker)));
}

/// Polls a server's metrics until `name` reaches `at_least`.
inline bool wait_metric(unsigned short metrics_port, const std::string& name, std::uint64_t at_least,
                        std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (metric(http_get(metrics_port, "/metrics"), name) >= at_least) return true;
    ::poll(nullptr, 0, 10);
  }
  return false;
}

/// The resident set of a process, in bytes (VmRSS).
inline std::uint64_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

/// CPU seconds (user and system) a process has used.
inline double cpu_seconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(all.substr(all.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
    if (i == 15) break;
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// Lets this process (and the server it starts) hold `fds` descriptors.
inline void allow_descriptors(rlim_t fds) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min(std::max(limit.rlim_cur, fds), limit.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

/// `corma get` of one object, run again and again on a thread of its own
/// until stop(): how long each took, process start included.
class FreshFetches {
 public:
  explicit FreshFetches(std::vector<std::string> args) : args_(std::move(args)), thread_([this] { loop(); }) {}
  FreshFetches(const FreshFetches&) = delete;
  FreshFetches& operator=(const FreshFetches&) = delete;
  ~FreshFetches() { stop(); }

  /// Waits for the fetch under way, and runs no more.
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] std::size_t done() const { return done_.load(); }
  /// Each fetch's time in milliseconds, or -1 for a fetch that failed.
  [[nodiscard]] std::vector<double> took() {
    std::lock_guard lock(mutex_);
    return took_;
  }
  /// What the fetches that failed printed.
  [[nodiscard]] std::string failures() {
    std::lock_guard lock(mutex_);
    return failures_;
  }

 private:
  void loop() {
    while (!stopping_) {
      const auto start = std::chrono::steady_clock::now();
      auto process = Process::start(args_);
      const auto status = process.wait_exit(std::chrono::seconds(30));
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      {
        std::lock_guard lock(mutex_);
        took_.push_back(status == 0 ? ms : -1);
        if (status != 0) failures_ += process.captured;
      }
      ++done_;
    }
  }

  std::vector<std::string> args_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> done_{0};
  std::mutex mutex_;
  std::vector<double> took_;
  std::string failures_;
  std::thread thread_;
};

/// `count` connections to `port`, each sending `opening` once and then
/// `repeated` again and again (when not empty), on a thread of their own;
/// answers are read and thrown away when `drain`, else never read.
class Flooders {
 public:
  Flooders(unsigned short port, int count, std::vector<std::byte> opening, std::vector<std::byte> repeated, bool drain)
      : opening_(std::move(opening)), repeated_(std::move(repeated)), drain_(drain) {
    for (int i = 0; i < count; ++i) {
      auto& socket = sockets_.emplace_back(io_);
      socket.connect({boost::asio::ip::make_address("127.0.0.1"), port});
      start(socket);
    }
    thread_ = std::thread([this] { io_.run(); });
  }
  Flooders(const Flooders&) = delete;
  Flooders& operator=(const Flooders&) = delete;
  ~Flooders() {
    boost::asio::post(io_, [this] {
      for (auto& socket : sockets_) {
        boost::system::error_code ignored;
        socket.close(ignored);
      }
    });
    thread_.join();
  }

 private:
  void start(boost::asio::ip::tcp::socket& socket) {
    boost::asio::async_write(socket, boost::asio::buffer(opening_), [this, &socket](auto ec, std::size_t) {
      if (!ec) write_again(socket);
    });
    if (drain_) read_again(socket, std::make_shared<std::array<char, 65536>>());
  }
  void write_again(boost::asio::ip::tcp::socket& socket) {
    if (repeated_.empty()) return;
    boost::asio::async_write(socket, boost::asio::buffer(repeated_), [this, &socket](auto ec, std::size_t) {
      if (!ec) write_again(socket);
    });
  }
  void read_again(boost::asio::ip::tcp::socket& socket, std::shared_ptr<std::array<char, 65536>> sink) {
    socket.async_read_some(boost::asio::buffer(*sink), [this, &socket, sink](auto ec, std::size_t) {
      if (!ec) read_again(socket, sink);
    });
  }

  boost::asio::io_context io_;
  std::deque<boost::asio::ip::tcp::socket> sockets_;
  std::vector<std::byte> opening_;
  std::vector<std::byte> repeated_;
  bool drain_;
  std::thread thread_;
};

}  // namespace corma::cli::testing
