// The `corma` subcommands; each returns the process exit status.
#pragma once

#include "transport_options.hpp"

#include <corma/consumer.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace corma::cli {

/// Where the owners of a cluster announce themselves (etcd), if anywhere.
struct DirectoryOptions {
  std::string address;  ///< HOST:PORT of etcd; empty: no directory
  std::string key_prefix = "/corma";
  std::string user;           ///< etcd's user, when its authentication is on
  std::string password_file;  ///< the file holding that user's password
  std::string cacert;  ///< TLS to etcd: the CA its certificates chain to
  std::string cert;    ///< TLS to etcd: this client's certificate...
  std::string key;     ///< ...and its key
};

struct ServeOptions {
  std::string root;
  std::string listen = "127.0.0.1:7300";
  std::string budget = "1G";
  std::string metrics;  ///< empty: no metrics endpoint
  std::string snapshot_limit = "1G";  ///< bytes of file snapshots alive at once
  unsigned file_threads = 2;          ///< threads that read served files, off the event loop
  std::size_t max_connections = 1024;
  std::size_t max_handshakes = 128;
  std::size_t max_leases = 65536;
  double lease_timeout_s = 10;  ///< a lease lapses this long after its last acquire, renew or pull
  double io_timeout_s = 10;     ///< the hello, the rest of a frame once begun, every write
  double idle_timeout_s = 60;   ///< a connection silent this long between frames is closed
  TransportOptions transport;
  DirectoryOptions directory;
  std::string owner_id;                 ///< empty: <host name>-<port>
  std::vector<std::string> announce;    ///< name prefixes announced; empty: "" (every file)
  double announce_ttl_s = 10;
  bool announce_files = false;    ///< every file by name, its modification time (ns) as its version
  double announce_rescan_s = 2;   ///< with announce_files: how often the root is scanned again
  bool accept_push = false;  ///< OwnerConfig::accept_push
  std::string cluster_key_file;  ///< the key this owner proves who it is with; empty: none
};

struct GetOptions {
  std::string owner;
  std::string path;
  std::string output;
  std::string budget = "4G";
  bool no_rdma = false;
  bool push = false;  ///< the owner writes the file into its mapping (async_push_fetch)
  std::uint32_t pull_window = ConsumerConfig{}.pull_window;
  TransportOptions transport;
  DirectoryOptions directory;  ///< set: `owner` is not given, the directory finds one
  std::string cluster_key_file;  ///< owners must prove they hold this key; empty: none
  std::optional<std::uint64_t> version;  ///< with `directory`: only owners announcing this version
};

struct ListOptions {
  DirectoryOptions directory;
  std::string prefix;
};

int run_serve(const ServeOptions& options);
int run_get(const GetOptions& options);
int run_demo();
int run_list(const ListOptions& options);

}  // namespace corma::cli
