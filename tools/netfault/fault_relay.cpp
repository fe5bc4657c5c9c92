// corma-fault-relay: the link between two network namespaces, with the
// faults this kernel cannot add by itself (it has no netem). It opens a TUN
// device named `fault0` in each namespace and forwards every IP packet one
// reads to the other after a fixed delay; a share of the packets can be held
// longer, so that they arrive out of order. Loss, partitions and rate limits
// are not its job: nftables rules and tbf in the namespaces do those.
//
//   corma-fault-relay NS_A NS_B [--delay-us N] [--reorder-percent P]
//                     [--reorder-extra-us N] [--queue-bytes N]
//
// Packets wait in one queue ordered by when they are due; a packet that
// would take the queue past --queue-bytes is dropped, as a router's full
// buffer would. Once both devices exist it prints "ready" and forwards until
// it is killed (or its parent dies); the devices go with it. The harness
// gives the devices their addresses, MTU and qdiscs.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string namespace_a;
  std::string namespace_b;
  std::chrono::microseconds delay{0};
  unsigned reorder_percent = 0;
  std::chrono::microseconds reorder_extra{1000};
  std::size_t queue_bytes = 16u << 20;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "corma-fault-relay: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr,
               "corma-fault-relay: %s\nusage: corma-fault-relay NS_A NS_B [--delay-us N] [--reorder-percent P] "
               "[--reorder-extra-us N] [--queue-bytes N]\n",
               problem);
  std::exit(2);
}

std::uint64_t number(const char* text) {
  char* end = nullptr;
  errno = 0;
  const auto value = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') usage("not a number");
  return value;
}

Options parse(int argc, char** argv) {
  if (argc < 3) usage("two namespaces are needed");
  Options options{argv[1], argv[2]};
  for (int i = 3; i < argc; i += 2) {
    if (i + 1 >= argc) usage("an option without its value");
    const std::string option = argv[i];
    const auto value = number(argv[i + 1]);
    if (option == "--delay-us") {
      options.delay = std::chrono::microseconds(value);
    } else if (option == "--reorder-percent") {
      if (value > 100) usage("--reorder-percent is 0 to 100");
      options.reorder_percent = static_cast<unsigned>(value);
    } else if (option == "--reorder-extra-us") {
      options.reorder_extra = std::chrono::microseconds(value);
    } else if (option == "--queue-bytes") {
      options.queue_bytes = value;
    } else {
      usage("unknown option");
    }
  }
  return options;
}

/// Enters the named namespace (this thread, which is the only one).
void enter(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("open " + path);
  if (::setns(fd, CLONE_NEWNET) != 0) die("setns " + path);
  ::close(fd);
}

/// A TUN device named fault0 in `network_namespace`: a device is created in
/// the namespace of the thread that opens it.
int open_tun(const std::string& network_namespace) {
  enter("/run/netns/" + network_namespace);
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("open /dev/net/tun");
  ifreq request{};
  std::snprintf(request.ifr_name, IFNAMSIZ, "fault0");
  request.ifr_flags = IFF_TUN | IFF_NO_PI;
  if (::ioctl(fd, TUNSETIFF, &request) != 0) die("TUNSETIFF in " + network_namespace);
  return fd;
}

struct Packet {
  Clock::time_point due;
  std::uint64_t sequence;  // equal due times leave in arrival order
  int out;
  std::vector<char> bytes;
  bool operator>(const Packet& other) const {
    return due != other.due ? due > other.due : sequence > other.sequence;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const auto options = parse(argc, argv);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test that started it
  const int home = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  const int a = open_tun(options.namespace_a);
  const int b = open_tun(options.namespace_b);
  if (home >= 0) ::setns(home, CLONE_NEWNET);
  std::printf("ready\n");
  std::fflush(stdout);

  std::priority_queue<Packet, std::vector<Packet>, std::greater<>> queue;
  std::size_t queued_bytes = 0;
  std::uint64_t sequence = 0;
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<unsigned> percent(0, 99);
  std::vector<char> buffer(65536);
  pollfd devices[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  for (;;) {
    // ppoll waits to the microsecond (poll and epoll round up to whole
    // milliseconds, which would add to every delay).
    timespec wait{};
    timespec* timeout = nullptr;
    if (!queue.empty()) {
      const auto left = std::max(Clock::duration::zero(), queue.top().due - Clock::now());
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      wait.tv_sec = static_cast<time_t>(ns / 1000000000);
      wait.tv_nsec = static_cast<long>(ns % 1000000000);
      timeout = &wait;
    }
    if (::ppoll(devices, 2, timeout, nullptr) < 0 && errno != EINTR) die("ppoll");
    for (auto& device : devices) {
      if ((device.revents & POLLIN) == 0) continue;
      const int out = device.fd == a ? b : a;
      for (int i = 0; i < 64; ++i) {  // a burst, then the other side's turn
        const auto n = ::read(device.fd, buffer.data(), buffer.size());
        if (n <= 0) break;
        const auto size = static_cast<std::size_t>(n);
        if (queued_bytes + size > options.queue_bytes) continue;  // a full buffer drops
        auto due = Clock::now() + options.delay;
        if (options.reorder_percent > 0 && percent(random) < options.reorder_percent) due += options.reorder_extra;
        queue.push(Packet{due, sequence++, out, std::vector<char>(buffer.data(), buffer.data() + size)});
        queued_bytes += size;
      }
    }
    const auto now = Clock::now();
    while (!queue.empty() && queue.top().due <= now) {
      const auto& packet = queue.top();
      (void)::write(packet.out, packet.bytes.data(), packet.bytes.size());  // a refused write is a lost packet
      queued_bytes -= packet.bytes.size();
      queue.pop();
    }
  }
}
