#include "netfault/fault_link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

extern char** environ;

namespace corma::netfault {

namespace fs = std::filesystem;

namespace {

/// A child whose standard output and error come back through one pipe.
struct Child {
  pid_t pid = -1;
  int output = -1;
};

Child spawn(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child child;
  if (posix_spawn(&child.pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) child.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  child.output = fds[0];
  return child;
}

/// Reads the child's output into `into` until it holds `text`, the pipe
/// closes or `limit` passes; whether it holds `text` (with "" : until closed).
bool read_output(int fd, std::string& into, const std::string& text, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (text.empty() || into.find(text) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd ready{fd, POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(left.count())) <= 0) return false;
    char buffer[4096];
    const auto n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) return text.empty();
    into.append(buffer, static_cast<std::size_t>(n));
  }
  return true;
}

void kill_and_reap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

std::string ip() { return tool("ip"); }

/// Namespaces left by a test process that died before it could remove
/// them: named cnf-<pid>-..., their pid no longer running.
void remove_stale_namespaces() {
  const auto listed = run_command({ip(), "netns", "list"});
  std::istringstream lines(listed.output);
  for (std::string line; std::getline(lines, line);) {
    const auto name = line.substr(0, line.find(' '));
    if (name.rfind("cnf-", 0) != 0) continue;
    const auto pid = std::atoi(name.c_str() + 4);
    if (pid <= 0 || fs::exists("/proc/" + std::to_string(pid))) continue;
    const auto pids = run_command({ip(), "netns", "pids", name});
    std::istringstream each(pids.output);
    for (int p = 0; each >> p;) ::kill(p, SIGKILL);
    run_command({ip(), "netns", "del", name});
  }
}

int next_pair() {
  static std::atomic<int> pairs{0};
  return ++pairs;
}

/// The drop rules for one namespace's input chain, as nft text.
std::string ruleset(const std::vector<std::string>& rules) {
  std::string text = "table inet corma_fault\ndelete table inet corma_fault\n"
                     "table inet corma_fault {\n  chain input {\n"
                     "    type filter hook input priority 0; policy accept;\n";
  for (const auto& rule : rules) text += "    " + rule + "\n";
  return text + "  }\n}\n";
}

void set_timeouts(int fd, std::chrono::seconds limit) {
  timeval tv{static_cast<time_t>(limit.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool connect_to(int fd, const std::string& address, std::uint16_t port) {
  const auto to = socket_address(address, port);
  return ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0;
}

}  // namespace

sockaddr_in socket_address(const std::string& address, std::uint16_t port) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  ::inet_pton(AF_INET, address.c_str(), &to.sin_addr);
  return to;
}

std::string tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    if (fs::exists(std::string(dir) + name)) return std::string(dir) + name;
  }
  return {};
}

Ran run_command(const std::vector<std::string>& args, std::chrono::seconds limit) {
  auto child = spawn(args);
  Ran ran;
  if (child.pid <= 0) {
    ::close(child.output);
    ran.output = "cannot start " + args.front();
    return ran;
  }
  const bool ended = read_output(child.output, ran.output, "", limit);
  ::close(child.output);
  if (!ended) {
    kill_and_reap(child.pid);
    return ran;
  }
  int status = 0;
  ::waitpid(child.pid, &status, 0);
  ran.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return ran;
}

std::optional<std::string> FaultLink::unavailable() {
  if (::geteuid() != 0) return "the network fault tests need root (network namespaces, TUN, nftables)";
  for (const char* needed : {"ip", "nft", "tc"}) {
    if (tool(needed).empty()) return std::string("no '") + needed + "' (scripts/setup installs iproute2 and nftables)";
  }
  if (!fs::exists("/dev/net/tun")) return "no /dev/net/tun: the kernel has no TUN devices";
  const std::string probe = "cnf-" + std::to_string(::getpid()) + "-probe";
  const auto made = run_command({ip(), "netns", "add", probe});
  if (made.status != 0) return "cannot create a network namespace here: " + made.output;
  run_command({ip(), "netns", "del", probe});
  return std::nullopt;
}

FaultLink::FaultLink(LinkProfile profile, std::string relay) : profile_(profile) {
  remove_stale_namespaces();
  const auto prefix = "cnf-" + std::to_string(::getpid()) + "-" + std::to_string(next_pair());
  owner_ = prefix + "-o";
  consumer_ = prefix + "-c";
  for (const auto& ns : {owner_, consumer_}) {
    if (run_command({ip(), "netns", "add", ns}).status != 0) {
      fail("ip netns add " + ns + " failed");
      return;
    }
    run_command({ip(), "-n", ns, "link", "set", "lo", "up"});
  }
  auto started = spawn({relay, owner_, consumer_, "--delay-us", std::to_string(profile.one_way_delay.count()),
                        "--reorder-percent", std::to_string(profile.reorder_percent), "--reorder-extra-us",
                        std::to_string(profile.reorder_extra.count())});
  relay_ = started.pid;
  std::string said;
  const bool relaying = relay_ > 0 && read_output(started.output, said, "ready\n", std::chrono::seconds(10));
  ::close(started.output);  // the relay says nothing more that matters
  if (!relaying) {
    fail("the fault relay did not start: " + said);
    return;
  }
  for (const auto side : {Side::owner, Side::consumer}) {
    const auto& ns = name(side);
    const auto up = run_command({ip(), "-n", ns, "link", "set", "fault0", "mtu", std::to_string(profile.mtu),
                                 "txqueuelen", "1000", "up"});
    const auto addressed = run_command({ip(), "-n", ns, "addr", "add", address(side) + "/24", "dev", "fault0"});
    if (up.status != 0 || addressed.status != 0) {
      fail("cannot configure fault0 in " + ns + ": " + up.output + addressed.output);
      return;
    }
    if (profile.rate_bits_per_second > 0) {
      const auto shaped =
          run_in(side, {tool("tc"), "qdisc", "replace", "dev", "fault0", "root", "tbf", "rate",
                        std::to_string(profile.rate_bits_per_second) + "bit", "burst", "256kb", "latency", "20ms"});
      if (shaped.status != 0) {
        fail("tbf refused: " + shaped.output);
        return;
      }
    }
  }
  if (!set_loss(profile.loss_per_mille)) return;
  ready_ = true;
}

FaultLink::~FaultLink() {
  for (const auto& ns : {owner_, consumer_}) {
    if (ns.empty()) continue;
    const auto pids = run_command({ip(), "netns", "pids", ns});
    std::istringstream each(pids.output);
    for (int p = 0; each >> p;) ::kill(p, SIGKILL);
  }
  kill_and_reap(relay_);  // its devices go with it
  for (const auto& ns : {owner_, consumer_}) {
    if (!ns.empty()) run_command({ip(), "netns", "del", ns});
  }
}

bool FaultLink::fail(std::string why) {
  why_not_ = std::move(why);
  ready_ = false;
  return false;
}

Launched::Launched(Launched&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), output_(std::exchange(other.output_, -1)), said_(std::move(other.said_)) {}

Launched::~Launched() {
  kill_and_reap(pid_);
  if (output_ >= 0) ::close(output_);
}

bool Launched::wait_for(const std::string& text, std::chrono::milliseconds limit) {
  return output_ >= 0 && read_output(output_, said_, text, limit);
}

std::vector<std::string> FaultLink::command_in(Side side, const std::vector<std::string>& args) const {
  std::vector<std::string> wrapped = {ip(), "netns", "exec", name(side)};
  wrapped.insert(wrapped.end(), args.begin(), args.end());
  return wrapped;
}

Launched FaultLink::launch_in(Side side, const std::vector<std::string>& args) const {
  const auto child = spawn(command_in(side, args));
  return Launched(child.pid, child.output);
}

Ran FaultLink::run_in(Side side, const std::vector<std::string>& args) const {
  return run_command(command_in(side, args));
}

int FaultLink::socket_in(Side side, int type) const {
  // A socket belongs to the namespace of the thread that made it; a thread
  // of its own enters the namespace so that this one never leaves its own.
  int fd = -1;
  std::thread maker([&] {
    const int ns = ::open(("/run/netns/" + name(side)).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return;
    if (::setns(ns, CLONE_NEWNET) == 0) fd = ::socket(AF_INET, type | SOCK_CLOEXEC, 0);
    ::close(ns);
  });
  maker.join();
  return fd;
}

FaultLink::Entered FaultLink::enter(Side side) const {
  const int home = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  const int ns = ::open(("/run/netns/" + name(side)).c_str(), O_RDONLY | O_CLOEXEC);
  const bool entered = ns >= 0 && ::setns(ns, CLONE_NEWNET) == 0;
  if (ns >= 0) ::close(ns);
  if (!entered) {
    ::close(home);
    throw std::runtime_error("cannot enter the network namespace " + name(side));
  }
  return Entered(home);
}

FaultLink::Entered::~Entered() {
  if (home_ < 0) return;
  ::setns(home_, CLONE_NEWNET);
  ::close(home_);
}

bool FaultLink::partition(Cut cut, std::uint16_t port) {
  const std::string to_owner = port == 0 ? "" : " tcp dport " + std::to_string(port);
  const std::string from_owner = port == 0 ? "" : " tcp sport " + std::to_string(port);
  if (cut != Cut::to_consumer_only) owner_rules_.push_back("ip saddr " + address(Side::consumer) + to_owner + " drop");
  if (cut != Cut::to_owner_only) consumer_rules_.push_back("ip saddr " + address(Side::owner) + from_owner + " drop");
  return apply_rules();
}

bool FaultLink::heal() {
  owner_rules_.clear();
  consumer_rules_.clear();
  return set_loss(profile_.loss_per_mille);
}

bool FaultLink::set_loss(unsigned per_mille) {
  profile_.loss_per_mille = per_mille;
  return apply_rules();
}

bool FaultLink::apply_rules() {
  const std::string loss =
      profile_.loss_per_mille == 0 ? "" : "numgen random mod 1000 < " + std::to_string(profile_.loss_per_mille) + " drop";
  for (const auto side : {Side::owner, Side::consumer}) {
    auto rules = side == Side::owner ? owner_rules_ : consumer_rules_;
    if (!loss.empty()) rules.push_back(loss);
    const auto file = fs::temp_directory_path() / (name(side) + ".nft");
    std::ofstream(file) << ruleset(rules);
    const auto applied = run_in(side, {tool("nft"), "-f", file.string()});
    fs::remove(file);
    if (applied.status != 0) return fail("nft refused the rules in " + name(side) + ": " + applied.output);
  }
  return true;
}

std::string http_get_in(const FaultLink& pair, Side side, std::uint16_t port, const std::string& target) {
  const int fd = pair.socket_in(side, SOCK_STREAM);
  if (fd < 0) return {};
  set_timeouts(fd, std::chrono::seconds(5));
  std::string response;
  if (connect_to(fd, "127.0.0.1", port)) {
    const std::string request = "GET " + target + " HTTP/1.0\r\n\r\n";
    if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) response.append(buffer, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return response;
}

std::optional<std::chrono::steady_clock::duration> time_tcp_stream(const FaultLink& pair, std::uint64_t bytes) {
  const int listener = pair.socket_in(Side::owner, SOCK_STREAM);
  const int receiver = pair.socket_in(Side::consumer, SOCK_STREAM);
  const auto close_both = [&] {
    if (listener >= 0) ::close(listener);
    if (receiver >= 0) ::close(receiver);
  };
  auto at = socket_address(FaultLink::address(Side::owner), 0);
  socklen_t length = sizeof at;
  if (listener < 0 || receiver < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 ||
      ::listen(listener, 1) != 0 || ::getsockname(listener, reinterpret_cast<sockaddr*>(&at), &length) != 0) {
    close_both();
    return std::nullopt;
  }
  set_timeouts(listener, std::chrono::seconds(30));
  set_timeouts(receiver, std::chrono::seconds(30));
  std::thread sender([&] {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    set_timeouts(fd, std::chrono::seconds(30));
    std::vector<char> block(1 << 20, 'x');
    for (std::uint64_t sent = 0; sent < bytes;) {
      const auto n = ::write(fd, block.data(), std::min<std::uint64_t>(block.size(), bytes - sent));
      if (n <= 0) break;
      sent += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
  });
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t received = 0;
  if (connect_to(receiver, FaultLink::address(Side::owner), ntohs(at.sin_port))) {
    std::vector<char> block(1 << 20);
    for (ssize_t n; received < bytes && (n = ::read(receiver, block.data(), block.size())) > 0;) {
      received += static_cast<std::uint64_t>(n);
    }
  }
  const auto took = std::chrono::steady_clock::now() - start;
  ::shutdown(listener, SHUT_RDWR);  // a sender still waiting to accept gives up
  sender.join();
  close_both();
  if (received != bytes) return std::nullopt;
  return took;
}

}  // namespace corma::netfault
