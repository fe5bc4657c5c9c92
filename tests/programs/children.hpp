// Running the child programs of tests/programs from a gtest: started
// together (a batch runs in parallel), each waited for with a bound, its
// output kept for the failure message. An abort in a child is its exit
// status, not the end of the test runner.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace corma::programs::testing {

struct ChildResult {
  int status = -1;  ///< the exit status, 128 + the signal, or -1 when it ran past its bound (killed)
  std::string output;  ///< stdout and stderr together
};

inline std::string describe(const std::vector<std::string>& args, const ChildResult& r) {
  std::string line;
  for (const auto& a : args) line += a + " ";
  const std::string how = r.status < 0    ? "ran past its bound and was killed"
                          : r.status > 128 ? "died of signal " + std::to_string(r.status - 128) + " (" +
                                                 strsignal(r.status - 128) + ")"
                                           : "exited " + std::to_string(r.status);
  return line + how + "\n" + r.output;
}

/// Runs every command at once and waits for all of them, each for at most
/// `limit`; what each one did, in order.
inline std::vector<ChildResult> run_children(const std::vector<std::vector<std::string>>& commands,
                                             std::chrono::milliseconds limit) {
  struct Running {
    pid_t pid = -1;
    int output = -1;
    ChildResult result;
    bool exited = false;
  };
  std::vector<Running> running(commands.size());
  for (std::size_t i = 0; i < commands.size(); ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe: " << std::strerror(errno);
      continue;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : commands[i]) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int spawned = ::posix_spawn(&running[i].pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    running[i].output = fds[0];
    if (spawned != 0) {
      ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(spawned);
      running[i].pid = -1;
    }
  }
  // Read every child's output until it closes (the child exited), bounded.
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    std::vector<pollfd> open;
    for (const auto& r : running) {
      if (r.output >= 0) open.push_back({r.output, POLLIN, 0});
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (open.empty() || left.count() <= 0) break;
    if (::poll(open.data(), open.size(), static_cast<int>(left.count())) <= 0) continue;
    for (auto& r : running) {
      if (r.output < 0) continue;
      pollfd one{r.output, POLLIN, 0};
      if (::poll(&one, 1, 0) <= 0) continue;
      char buffer[4096];
      const auto n = ::read(r.output, buffer, sizeof buffer);
      if (n > 0) {
        r.result.output.append(buffer, static_cast<std::size_t>(n));
      } else {
        ::close(r.output);
        r.output = -1;
      }
    }
  }
  std::vector<ChildResult> results;
  for (auto& r : running) {
    if (r.pid > 0) {
      if (r.output >= 0) ::kill(r.pid, SIGKILL);  // still talking past the bound: a hang
      int status = 0;
      ::waitpid(r.pid, &status, 0);
      if (r.output < 0) r.result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (r.output >= 0) ::close(r.output);
    results.push_back(std::move(r.result));
  }
  return results;
}

}  // namespace corma::programs::testing
