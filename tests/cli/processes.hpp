// Test helpers for the `corma` command: a temporary served tree, and the
// command run as a real process whose output is read back.
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace corma::cli::testing {

namespace fs = std::filesystem;

class TempTree : public ::testing::Test {
 protected:
  fs::path base = fs::temp_directory_path() / ("corma-cli-" + std::to_string(::getpid()) + "-" + test_name());
  fs::path root = base / "root";

  /// The running test's name, usable as one path component (a parameterised
  /// test's name holds a '/').
  static std::string test_name() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '-');
    return name;
  }

  void SetUp() override {
    fs::remove_all(base);
    fs::create_directories(root / "sub");
  }
  void TearDown() override { fs::remove_all(base); }

  static void write_file(const fs::path& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::vector<char> read_file(const fs::path& path) {
    std::error_code ec;
    std::vector<char> bytes(static_cast<std::size_t>(fs::file_size(path, ec)));
    if (ec) return {};
    std::ifstream(path, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return bytes;
  }
};

struct Process {
  pid_t pid = -1;
  int output = -1;  // stdout and stderr together
  std::string captured;

  static Process start(const std::vector<std::string>& args) {
    int pipe_fds[2];
    EXPECT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    Process p;
    EXPECT_EQ(posix_spawn(&p.pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    p.output = pipe_fds[0];
    return p;
  }

  /// Reads output until it contains `text` or the deadline passes.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (captured.find(text) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{output, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      char buffer[4096];
      const auto n = ::read(output, buffer, sizeof buffer);
      if (n <= 0) return captured.find(text) != std::string::npos;
      captured.append(buffer, static_cast<std::size_t>(n));
    }
    return true;
  }

  /// The exit status, or nullopt if it did not exit within `limit`.
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    pollfd pfd{pidfd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(limit.count()));
    ::close(pidfd);
    if (ready <= 0) return std::nullopt;
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    wait_for_output("\x01", std::chrono::milliseconds(200));  // drain what is left
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  /// Anonymous memory the process has resident (RssAnon), 0 once it is gone.
  /// Fresh heap pages become resident only when written: a process filling a
  /// buffer of its own shows its progress here, however the bytes arrive.
  [[nodiscard]] std::uint64_t resident_anonymous_bytes() const {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;  // in kB
    }
    return 0;
  }

  Process() = default;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  // Moving hands the child over: only one Process ever kills and reaps it.
  Process(Process&& other) noexcept
      : pid(std::exchange(other.pid, -1)), output(std::exchange(other.output, -1)), captured(std::move(other.captured)) {}

  ~Process() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (output >= 0) ::close(output);
  }
};

/// The port a "listening on 127.0.0.1:PORT" (or "http://127.0.0.1:PORT") line names.
inline std::string port_after(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  if (at == std::string::npos) return {};
  const auto colon = text.find(':', at + marker.size());
  const auto end = text.find_first_not_of("0123456789", colon + 1);
  return text.substr(colon + 1, end - colon - 1);
}

inline std::string http_get(unsigned short port, const std::string& target) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return {};
  const std::string request = "GET " + target + " HTTP/1.0\r\n\r\n";
  boost::asio::write(socket, boost::asio::buffer(request), ec);
  std::string response;
  boost::asio::read(socket, boost::asio::dynamic_buffer(response), ec);
  return response;
}

inline std::uint64_t metric(const std::string& page, const std::string& name) {
  const auto at = page.find("\n" + name + " ");
  return at == std::string::npos ? 0 : std::stoull(page.substr(at + name.size() + 2));
}

class TwoProcesses : public TempTree {
 protected:
  std::string binary = CORMA_BINARY;

  Process serve(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {binary, "serve", "--root", root.string(), "--listen", "127.0.0.1:0",
                                     "--metrics", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = Process::start(args);
    EXPECT_TRUE(server.wait_for_output("/metrics")) << server.captured;
    return server;
  }

  /// Runs `corma` with `args` to its end; its exit status and output.
  std::pair<int, std::string> run_corma(std::vector<std::string> args) {
    args.insert(args.begin(), binary);
    auto process = Process::start(args);
    auto status = process.wait_exit(std::chrono::seconds(30));
    return {status.value_or(-1), process.captured};
  }
};

}  // namespace corma::cli::testing
