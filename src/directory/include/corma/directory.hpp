// Directory: where owners say what they serve and consumers find them, kept
// in etcd (its v3 JSON API), never in a store of corma's own. An owner
// announces its endpoint and names under one etcd lease it keeps alive: a
// clean withdrawal revokes it, and a dead owner's entries vanish when the
// lease expires. A consumer resolves a name to the owners that serve it,
// ordered by a documented rule, from a cache it refreshes from etcd (and
// keeps answering from while etcd is down). docs/architecture.md ("Many
// owners") lays the keys out to the byte.
#pragma once

#include <corma/detail/as_operation.hpp>
#include <corma/error.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace corma {

/// One etcd member's client endpoint: an IP address and port (its JSON
/// gateway).
struct EtcdMember {
  std::string host;
  std::uint16_t port = 2379;
};

struct DirectoryConfig {
  /// etcd's client endpoint: an IP address and port (its JSON gateway).
  std::string host = "127.0.0.1";
  std::uint16_t port = 2379;
  /// The other members of etcd's cluster: a call (or the watch) that cannot
  /// reach the member in use moves to the next, in turn.
  std::vector<EtcdMember> other_members;
  /// etcd's user and password, when its authentication is on: a token is
  /// asked for at the first call (and again when etcd no longer takes it)
  /// and sent with every call and the watch. Empty user: none.
  std::string user;
  std::string password;
  /// TLS to every member (an https:// address, or a CA file given): etcd's
  /// certificate must chain to `tls_ca_file` (empty: the system's trusted
  /// CAs) and name the member's IP address. With `tls_cert_file` and
  /// `tls_key_file` (PEM), the client shows that certificate, as etcd's
  /// --client-cert-auth asks. A file that cannot be loaded fails every call
  /// with `not_configured`.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Every key lives under this prefix, so several clusters can share one etcd.
  std::string key_prefix = "/corma";
  /// Deadline for each call to etcd.
  std::chrono::milliseconds request_timeout{2000};
  /// How long a resolution is answered from the cache before etcd is asked
  /// again (while etcd is down, older answers are given, and counted).
  std::chrono::milliseconds cache_ttl{1000};
  /// This machine's name, for the same-host-first rule; empty: the host name.
  std::string machine;
  /// Keep the cache fresh with a watch on the cluster's keys (started by
  /// the first resolution). Off for a one-shot lookup (a command that
  /// resolves one name and exits): then every entry lives cache_ttl.
  bool watch = true;
  /// Told of each owner entry skipped because it is not one a consumer can
  /// rank and connect to (once per owner and entry; on the directory's
  /// executor). Counted in DirectoryStats::rejected_entries either way.
  std::function<void(const std::string& owner, const Error& why)> on_rejected_entry;
};

/// "HOST:PORT", "http://HOST:PORT" or "https://HOST:PORT" (HOST an IP
/// address), or several of them separated by commas (the members of etcd's
/// cluster, all with TLS or none), into a config.
[[nodiscard]] Result<DirectoryConfig> parse_directory_address(std::string_view address);

/// One owner as it announces itself.
struct OwnerEntry {
  std::string id;       ///< unique among the directory's owners
  std::string host;     ///< the rendezvous endpoint consumers connect to
  std::uint16_t port = 0;
  std::string machine;  ///< where it runs (same-host consumers can use shared memory)
  std::string transport;  ///< "tcp", "shm", "verbs" or "none" (chunks only)
  std::uint16_t protocol_version = 0;
  std::uint64_t load = 0;  ///< lower is preferred
  /// In a resolution: the version of the name this owner announced (see
  /// Announcement::versions); empty when it announced none, or serves the
  /// name by a prefix.
  std::optional<std::uint64_t> version{};
};

struct Announcement {
  OwnerEntry owner;
  /// Exact names, and name prefixes (an owner of millions of objects
  /// announces prefixes: "" serves every name).
  std::vector<std::string> names;
  std::vector<std::string> prefixes;
  /// The version this owner holds of some of `names`: a number that grows
  /// with every change of the object and is the same on every owner holding
  /// the same bytes (the writer's version counter, or a file's modification
  /// time in nanoseconds where replicas keep it). Consumers rank the owners
  /// of a name newest first, and can ask for one version. A name not in
  /// `names` is refused.
  std::map<std::string, std::uint64_t, std::less<>> versions;
  /// The lease's time to live: the owner's entries vanish this long after
  /// it stops renewing. Renewed every third of it.
  std::chrono::seconds ttl{10};
  /// Where the owner's load figure comes from, if it changes: asked at
  /// each renewal (on the directory's executor), and a figure that differs
  /// from the one announced rewrites the owner's entry under the same
  /// lease. The load is never written more often than the lease is renewed.
  std::function<std::uint64_t()> current_load;
};

/// One name's owners, best first, or why there are none.
using Resolution = Result<std::vector<OwnerEntry>>;

/// A name and an owner that announced it (or a prefix of it).
struct DirectoryListing {
  std::string name;  ///< a name, or a prefix ending in '*'
  std::string owner;
  /// The version of the name the owner announced (empty: none, or a prefix).
  std::optional<std::uint64_t> version{};
  /// Why consumers skip this owner (its entry is missing, or is not one a
  /// consumer could rank and connect to); empty: its entry is good.
  std::string unusable{};
};

struct DirectoryStats {
  std::uint64_t resolutions = 0;
  std::uint64_t cache_hits = 0;
  /// Answered from an old cache entry because etcd could not be reached.
  std::uint64_t stale_resolutions = 0;
  std::uint64_t etcd_failures = 0;
  /// Requests sent to etcd (a set resolved in one pass costs one per 128
  /// names not cached).
  std::uint64_t etcd_requests = 0;
  std::uint64_t leases_granted = 0;
  /// Owner entries skipped because a consumer could not rank or reach what
  /// they say (a host that is not an IP address, an unknown transport, a
  /// load that is not a whole number up to 2^40...): each owner and entry
  /// once.
  std::uint64_t rejected_entries = 0;  ///< more than one: etcd lost the lease and it was announced again
  bool announced = false;
  /// The watch that keeps the cache fresh is live: a cached answer read
  /// under it stands until etcd reports a change to it.
  bool watching = false;
};

/// Runs on one executor, like Owner and Consumer; its operations are Asio
/// initiating functions (`use_awaitable` by default).
class Directory {
 public:
  using DefaultToken = boost::asio::use_awaitable_t<>;

  Directory(boost::asio::any_io_executor executor, DirectoryConfig config);
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;
  /// Stops renewing (the entries then vanish with the lease; withdraw first
  /// to remove them at once).
  ~Directory();

  /// Owner: grants a lease, writes the owner's entry and its names under it,
  /// and renews it from then on; when etcd loses the lease (down longer
  /// than the ttl), a new one is granted and everything written again.
  /// Announcing again replaces the previous announcement: for the same
  /// owner id and ttl, under the lease it holds, writing only the keys that
  /// changed and deleting those no longer announced (consumers never find
  /// the owner missing meanwhile; should that fail, the next renewal
  /// writes everything under a new lease); otherwise under a new lease.
  /// Completes with Result<void>.
  template <class Token = DefaultToken>
  auto async_announce(Announcement announcement, Token&& token = {}) {
    return detail::as_operation(executor(), announce(std::move(announcement)), std::forward<Token>(token));
  }

  /// Owner: revokes the lease: every entry goes at once. Result<void>.
  template <class Token = DefaultToken>
  auto async_withdraw(Token&& token = {}) {
    return detail::as_operation(executor(), withdraw(), std::forward<Token>(token));
  }

  /// Consumer: the owners serving `name` (exactly, or by a prefix), best
  /// first: the newest version announced first (the highest number; an
  /// owner that announced none after every one that did), then same
  /// machine, then least loaded, then a hash of the name and the owner's id
  /// (stable, and spreading names over equal owners).
  /// `region_not_found` when none does. Result<std::vector<OwnerEntry>>.
  template <class Token = DefaultToken>
  auto async_resolve(std::string name, Token&& token = {}) {
    return detail::as_operation(executor(), resolve(std::move(name)), std::forward<Token>(token));
  }

  /// Consumer: each of `names` resolved as async_resolve would, in their
  /// order, in one pass: the names not cached are read from etcd together
  /// (a transaction of up to 128 ranges per round trip). Fails as a whole
  /// only when etcd cannot be reached and nothing is cached.
  /// Result<std::vector<Resolution>>.
  template <class Token = DefaultToken>
  auto async_resolve_many(std::vector<std::string> names, Token&& token = {}) {
    return detail::as_operation(executor(), resolve_many(std::move(names)), std::forward<Token>(token));
  }

  /// The names (and prefixes) announced under `prefix`, with their owners.
  /// Result<std::vector<DirectoryListing>>.
  template <class Token = DefaultToken>
  auto async_list(std::string prefix, Token&& token = {}) {
    return detail::as_operation(executor(), list(std::move(prefix)), std::forward<Token>(token));
  }

  [[nodiscard]] DirectoryStats stats() const;

  struct State;

 private:
  [[nodiscard]] boost::asio::any_io_executor executor() const;
  [[nodiscard]] boost::asio::awaitable<Result<void>> announce(Announcement announcement);
  [[nodiscard]] boost::asio::awaitable<Result<void>> withdraw();
  [[nodiscard]] boost::asio::awaitable<Result<std::vector<OwnerEntry>>> resolve(std::string name);
  [[nodiscard]] boost::asio::awaitable<Result<std::vector<Resolution>>> resolve_many(std::vector<std::string> names);
  [[nodiscard]] boost::asio::awaitable<Result<std::vector<DirectoryListing>>> list(std::string prefix);

  std::shared_ptr<State> state_;
};

}  // namespace corma
