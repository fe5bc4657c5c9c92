// A real etcd for a test: started on free loopback ports with a temporary
// data directory, stopped (and its directory removed) at the end. A test
// that finds no etcd binary skips and says why.
#pragma once

#include "cli/processes.hpp"

#include <corma/directory.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

namespace corma::testing {

class EtcdServer {
 public:
  static constexpr const char* binary = "/usr/bin/etcd";

  EtcdServer() : data_(std::filesystem::temp_directory_path() / ("corma-etcd-" + std::to_string(::getpid()))) {}
  ~EtcdServer() {
    stop();
    std::filesystem::remove_all(data_);
  }

  /// Why etcd cannot run here, if it cannot.
  static std::optional<std::string> missing() {
    if (std::filesystem::exists(binary)) return std::nullopt;
    return std::string("no etcd at ") + binary + " (scripts/setup installs Debian's etcd-server)";
  }

  /// Starts etcd (on the ports of its first start, when started again,
  /// with the same data) and waits until it serves clients.
  bool start() {
    if (client_port_ == 0) {
      client_port_ = free_port();
      peer_port_ = free_port();
    }
    const auto client = "http://127.0.0.1:" + std::to_string(client_port_);
    const auto peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    process_.emplace(spawn_dying_with_us(
        {binary, "--name", "corma-test", "--data-dir", data_.string(), "--listen-client-urls", client,
         "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", "corma-test=" + peer, "--log-level", "info"}));
    if (process_->wait_for_output("ready to serve client requests", std::chrono::seconds(20))) return true;
    ADD_FAILURE() << "etcd said:\n" << process_->captured;
    return false;
  }

  /// Stops it as a crash would (SIGKILL): clients see it gone at once.
  void stop() {
    if (!process_) return;
    ::kill(process_->pid, SIGKILL);
    (void)process_->wait_exit(std::chrono::seconds(5));
    process_.reset();
  }

  [[nodiscard]] DirectoryConfig config(std::string key_prefix) const {
    DirectoryConfig config;
    config.port = client_port_;
    config.key_prefix = std::move(key_prefix);
    return config;
  }

 private:
  /// Like Process::start, but the child is killed when this process dies
  /// however it dies (a test killed by its timeout leaves no etcd behind).
  static cli::testing::Process spawn_dying_with_us(const std::vector<std::string>& args) {
    int pipe_fds[2];
    EXPECT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    cli::testing::Process p;
    p.pid = ::fork();
    if (p.pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(pipe_fds[1], STDOUT_FILENO);
      ::dup2(pipe_fds[1], STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(pipe_fds[1]);
    p.output = pipe_fds[0];
    return p;
  }

  static std::uint16_t free_port() {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor probe(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    return probe.local_endpoint().port();
  }

  std::filesystem::path data_;
  std::uint16_t client_port_ = 0;
  std::uint16_t peer_port_ = 0;
  std::optional<cli::testing::Process> process_;
};

}  // namespace corma::testing
