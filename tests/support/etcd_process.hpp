// A private etcd for tests and benchmarks: free loopback ports, a
// temporary data directory, and a child that dies with this process
// however it dies. Started again, it keeps its ports and its data.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace corma::testing {

class EtcdProcess {
 public:
  static constexpr const char* binary = "/usr/bin/etcd";

  /// `launcher` runs etcd in another context (e.g. {"ip", "netns", "exec",
  /// NS}: a network namespace, where it listens on `host`).
  explicit EtcdProcess(std::vector<std::string> launcher = {}, std::string host = "127.0.0.1")
      : data_(std::filesystem::temp_directory_path() /
              ("corma-etcd-" + std::to_string(::getpid()) + "-" + std::to_string(next_instance()))),
        launcher_(std::move(launcher)),
        host_(std::move(host)) {}
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;
  ~EtcdProcess() {
    stop();
    std::filesystem::remove_all(data_);
  }

  /// Why etcd cannot run here, if it cannot.
  static std::optional<std::string> missing() {
    if (std::filesystem::exists(binary)) return std::nullopt;
    return std::string("no etcd at ") + binary + " (scripts/setup installs Debian's etcd-server)";
  }

  /// Makes this etcd `name`, one member of the cluster `initial_cluster`
  /// ("NAME=http://HOST:PEER_PORT,..."), on these ports (before launch()).
  void as_member(std::string name, std::uint16_t client_port, std::uint16_t peer_port, std::string initial_cluster) {
    name_ = std::move(name);
    client_port_ = client_port;
    peer_port_ = peer_port;
    initial_cluster_ = std::move(initial_cluster);
  }

  /// Makes this etcd serve its clients over TLS only, with this certificate
  /// and key, asking each client for a certificate signed by `client_ca`
  /// (before launch()).
  void with_tls(std::string cert_file, std::string key_file, std::string client_ca) {
    tls_ = {"--cert-file", std::move(cert_file), "--key-file", std::move(key_file), "--trusted-ca-file",
            std::move(client_ca), "--client-cert-auth"};
  }

  /// Starts etcd and waits until it serves clients; false (with what it
  /// said in output()) when it does not within `limit`.
  /// Ports it picked itself are free when picked, not when etcd binds
  /// them: a test running beside this one may take one in between. Then
  /// etcd exits, and it is started again on other ports, a fresh data
  /// directory, up to five times.
  bool start(std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    const bool picks_ports = client_port_ == 0;
    for (int attempt = 1;; ++attempt) {
      launch();
      if (wait_ready(limit)) return true;
      if (!picks_ports || attempt == 5 || output_.find("address already in use") == std::string::npos) return false;
      stop();
      std::filesystem::remove_all(data_);
      client_port_ = 0;
      peer_port_ = 0;
    }
  }

  /// Starts etcd without waiting (a cluster's members serve only once a
  /// quorum of them runs).
  void launch() {
    if (client_port_ == 0) {
      client_port_ = free_port();
      peer_port_ = free_port();
    }
    const auto client = (tls_.empty() ? "http://" : "https://") + host_ + ":" + std::to_string(client_port_);
    const auto peer = "http://" + host_ + ":" + std::to_string(peer_port_);
    const auto cluster = initial_cluster_.empty() ? name_ + "=" + peer : initial_cluster_;
    const std::vector<std::string> etcd = {binary, "--name", name_, "--data-dir", data_.string(),
                                           "--listen-client-urls", client, "--advertise-client-urls", client,
                                           "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                           "--initial-cluster", cluster};
    auto args = launcher_;
    args.insert(args.end(), etcd.begin(), etcd.end());
    args.insert(args.end(), tls_.begin(), tls_.end());
    spawn(args);
  }

  /// Waits until the launched etcd serves clients.
  bool wait_ready(std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    return wait_for_output("ready to serve client requests", limit);
  }

  /// Stops it as a crash would (SIGKILL): clients see it gone at once.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    ::close(output_fd_);
    output_fd_ = -1;
  }

  [[nodiscard]] std::uint16_t client_port() const noexcept { return client_port_; }
  [[nodiscard]] const std::string& output() const noexcept { return output_; }

  /// A loopback port nobody listens on now.
  static std::uint16_t free_port() {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor probe(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    return probe.local_endpoint().port();
  }

 private:
  static int next_instance() {
    static int instance = 0;
    return ++instance;
  }

  void spawn(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    output_.clear();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    output_fd_ = fds[0];
  }

  bool wait_for_output(const std::string& text, std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (output_.find(text) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0 || output_fd_ < 0) return false;
      pollfd ready{output_fd_, POLLIN, 0};
      if (::poll(&ready, 1, static_cast<int>(left.count())) <= 0) return false;
      char buffer[4096];
      const auto n = ::read(output_fd_, buffer, sizeof buffer);
      if (n <= 0) return false;
      output_.append(buffer, static_cast<std::size_t>(n));
    }
    return true;
  }

  std::filesystem::path data_;
  std::vector<std::string> launcher_;
  std::string host_;
  std::string name_ = "corma-test";
  std::string initial_cluster_;  ///< empty: a cluster of this one member
  std::vector<std::string> tls_;  ///< etcd's TLS flags; empty: plain HTTP
  std::uint16_t client_port_ = 0;
  std::uint16_t peer_port_ = 0;
  pid_t pid_ = -1;
  int output_fd_ = -1;
  std::string output_;
};

}  // namespace corma::testing
