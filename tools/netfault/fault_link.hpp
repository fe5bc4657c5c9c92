// Two private network namespaces joined by a link with faults: the owner's
// side (10.77.0.1) and the consumer's (10.77.0.2). The link is the fault
// relay (corma-fault-relay: a TUN device in each namespace, delay and
// reordering); random loss and partitions are nftables drop rules in each
// namespace's input chain (a drop on output would be an error the sender
// sees, not a lost packet); a rate limit is tbf on each device. Everything
// it makes (namespaces, the relay, what runs in them, the rules) goes when
// it is destroyed. Traffic never leaves the two namespaces. Used by the
// netfault tests and by corma-bench's rows across a real round trip.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace corma::netfault {

/// What the link does to every packet.
struct LinkProfile {
  std::chrono::microseconds one_way_delay{0};     ///< half the round trip it adds
  unsigned reorder_percent = 0;                   ///< packets held longer than the rest...
  std::chrono::microseconds reorder_extra{1000};  ///< ...by this much
  unsigned loss_per_mille = 0;                    ///< dropped at random, in each direction
  std::uint64_t rate_bits_per_second = 0;         ///< 0: no limit
  unsigned mtu = 9000;
};

enum class Side { owner, consumer };

/// Which way a partition drops packets.
enum class Cut { both_ways, to_owner_only, to_consumer_only };

/// The result of a command run to its end.
struct Ran {
  int status = -1;
  std::string output;
};

/// Where an administration tool (ip, nft, tc) lives, or "" (Debian keeps
/// them in /usr/sbin).
std::string tool(const std::string& name);

/// An IPv4 socket address.
sockaddr_in socket_address(const std::string& address, std::uint16_t port);

/// Runs `args` (argv[0] a path) and waits for it, killing it past `limit`.
Ran run_command(const std::vector<std::string>& args, std::chrono::seconds limit = std::chrono::seconds(20));

/// A process started by the link (launch_in): its output can be waited
/// for; it is killed and reaped when this goes.
class Launched {
 public:
  Launched(pid_t pid, int output) : pid_(pid), output_(output) {}
  Launched(Launched&& other) noexcept;
  Launched(const Launched&) = delete;
  Launched& operator=(const Launched&) = delete;
  Launched& operator=(Launched&&) = delete;
  ~Launched();

  /// Reads its output until it holds `text`; false past `limit`.
  bool wait_for(const std::string& text, std::chrono::milliseconds limit);
  [[nodiscard]] const std::string& said() const noexcept { return said_; }

 private:
  pid_t pid_;
  int output_;
  std::string said_;
};

class FaultLink {
 public:
  /// Why the link cannot be made here (not root, no TUN, no ip/nft/tc, or
  /// namespaces refused), if it cannot.
  static std::optional<std::string> unavailable();

  /// Makes the namespaces and the link; check ready() (and why_not()).
  /// `relay` is the path of corma-fault-relay.
  FaultLink(LinkProfile profile, std::string relay);
  FaultLink(const FaultLink&) = delete;
  FaultLink& operator=(const FaultLink&) = delete;
  ~FaultLink();

  [[nodiscard]] bool ready() const noexcept { return ready_; }
  [[nodiscard]] const std::string& why_not() const noexcept { return why_not_; }

  [[nodiscard]] const std::string& name(Side side) const { return side == Side::owner ? owner_ : consumer_; }
  [[nodiscard]] static std::string address(Side side) { return side == Side::owner ? "10.77.0.1" : "10.77.0.2"; }

  /// `args` as a command that runs inside `side`'s namespace (`ip netns
  /// exec`, which also shows the namespace's devices in /sys).
  [[nodiscard]] std::vector<std::string> command_in(Side side, const std::vector<std::string>& args) const;
  /// Starts `args` inside `side`'s namespace (through `ip netns exec`, so
  /// that it sees the namespace's devices in /sys too).
  [[nodiscard]] Launched launch_in(Side side, const std::vector<std::string>& args) const;
  /// Runs `args` inside `side`'s namespace to its end.
  Ran run_in(Side side, const std::vector<std::string>& args) const;
  /// A socket (SOCK_STREAM or SOCK_DGRAM, IPv4) that lives in `side`'s
  /// namespace: whatever this process does with it happens there.
  [[nodiscard]] int socket_in(Side side, int type) const;
  /// Moves the calling thread into `side`'s namespace (the sockets it opens,
  /// and the threads it starts, then live there) until the guard goes.
  class Entered {
   public:
    explicit Entered(int home) : home_(home) {}
    Entered(Entered&& other) noexcept : home_(other.home_) { other.home_ = -1; }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;
    Entered& operator=(Entered&&) = delete;
    ~Entered();

   private:
    int home_;
  };
  [[nodiscard]] Entered enter(Side side) const;

  /// Drops the packets of the owner's `port` (every packet between the
  /// two, when 0) the way `cut` says, until heal().
  bool partition(Cut cut, std::uint16_t port = 0);
  /// Lifts every partition.
  bool heal();
  /// Random loss in both directions from now on.
  bool set_loss(unsigned per_mille);

 private:
  bool apply_rules();
  bool fail(std::string why);

  LinkProfile profile_;
  std::string owner_;
  std::string consumer_;
  pid_t relay_ = -1;
  std::vector<std::string> owner_rules_;
  std::vector<std::string> consumer_rules_;
  bool ready_ = false;
  std::string why_not_;
};

/// An HTTP GET from inside `side`'s namespace to its own loopback (where
/// a process started there serves its metrics); the whole response.
std::string http_get_in(const FaultLink& link, Side side, std::uint16_t port, const std::string& target);

/// Streams `bytes` bytes over one plain TCP connection from the owner's side
/// to the consumer's, under the same link: the baseline corma is measured
/// against. The time from connecting to the last byte read, or nullopt.
std::optional<std::chrono::steady_clock::duration> time_tcp_stream(const FaultLink& link, std::uint64_t bytes);

}  // namespace corma::netfault
