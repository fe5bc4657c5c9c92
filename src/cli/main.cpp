// corma: serve files over the rendezvous, fetch them, or run the demo.
#include "commands.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  using namespace corma::cli;
  CLI::App app{"corma: asynchronous RDMA memory registration and remote memory access"};
  app.require_subcommand(1);

  ServeOptions serve;
  auto* serve_cmd = app.add_subcommand("serve", "serve the files under a directory, read-only");
  serve_cmd->add_option("--root", serve.root, "directory whose files are served by relative path")->required();
  serve_cmd->add_option("--listen", serve.listen, "HOST:PORT to listen on")->capture_default_str();
  serve_cmd->add_option("--budget", serve.budget, "registration budget (e.g. 512M, 2G)")->capture_default_str();
  serve_cmd->add_option("--transport", serve.transport.transport, "tcp, shm (UCX) or verbs (first RDMA device)")
      ->check(CLI::IsMember(transport_names()))
      ->capture_default_str();
  serve_cmd->add_flag("--trusted-peers", serve.transport.trusted_peers,
                      "expose memory for RDMA over tcp. RISK: UCX emulates RDMA over tcp in software and checks "
                      "nothing, so ANY peer that can reach this process can then read and write ALL of its memory");
  serve_cmd->add_option("--metrics", serve.metrics, "HOST:PORT for Prometheus text metrics at /metrics");
  serve_cmd->add_option("--snapshot-limit", serve.snapshot_limit,
                        "memory for the snapshots of files being served (each version read once, shared); a read "
                        "that finds it spent waits its turn for room, up to 10 s")
      ->capture_default_str();
  serve_cmd->add_option("--file-threads", serve.file_threads,
                        "threads that read served files into snapshots, so that a large or cold file never holds "
                        "up the event loop that serves every connection")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  serve_cmd->add_option("--max-connections", serve.max_connections, "open connections at most; more are refused")
      ->capture_default_str();
  serve_cmd->add_option("--max-handshakes", serve.max_handshakes,
                        "connections that have not said hello yet, at most; more are refused")
      ->capture_default_str();
  serve_cmd->add_option("--lease-timeout", serve.lease_timeout_s,
                        "seconds a lease lives after its last acquire, renew or pull")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  serve_cmd->add_option("--max-leases", serve.max_leases, "leases held at once over all connections")
      ->capture_default_str();
  serve_cmd->add_option("--io-timeout", serve.io_timeout_s,
                        "seconds for a connection's hello, for the rest of a frame once it began, and for each "
                        "answer written; past it the connection is closed")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  serve_cmd->add_flag("--accept-push", serve.accept_push,
                      "let consumers have files written into their memory (corma get --push); RISK: like "
                      "--trusted-peers, UCX takes the consumer's worker address and key unchecked");
  serve_cmd->add_option("--idle-timeout", serve.idle_timeout_s,
                        "seconds a connection may stay silent between requests before it is closed")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();

  const auto add_directory = [](CLI::App* command, DirectoryOptions& directory) {
    command->add_option("--directory", directory.address, "HOST:PORT of the etcd the cluster's owners announce in (several, comma-separated: the members of etcd's cluster, the next used when one cannot be reached)");
    command->add_option("--directory-prefix", directory.key_prefix,
                        "key prefix of this cluster in etcd (several clusters can share one)")
        ->capture_default_str();
    command->add_option("--directory-user", directory.user, "etcd's user, when etcd's authentication is on");
    command->add_option("--directory-password-file", directory.password_file,
                        "file holding that user's password (its first line; never on the command line)")
        ->check(CLI::ExistingFile);
    command->add_option("--directory-cacert", directory.cacert,
                        "TLS to etcd: the CA (PEM) etcd's certificate must chain to (https:// members without it: "
                        "the system's trusted CAs)")
        ->check(CLI::ExistingFile);
    command->add_option("--directory-cert", directory.cert,
                        "TLS to etcd: this client's certificate (PEM), for etcd's --client-cert-auth")
        ->check(CLI::ExistingFile);
    command->add_option("--directory-key", directory.key, "TLS to etcd: the key (PEM) of --directory-cert")
        ->check(CLI::ExistingFile);
  };
  add_directory(serve_cmd, serve.directory);
  serve_cmd->add_option("--cluster-key", serve.cluster_key_file,
                        "file holding the cluster's shared key (16 bytes to 4 KiB): this owner proves with it to "
                        "consumers that it holds the key and is its --owner-id")
      ->check(CLI::ExistingFile);
  serve_cmd->add_option("--owner-id", serve.owner_id, "this owner's id in the directory (default: HOST-PORT)");
  serve_cmd->add_option("--announce", serve.announce,
                        "a name prefix announced in the directory (repeatable; default: every file)");
  serve_cmd->add_option("--announce-ttl", serve.announce_ttl_s,
                        "seconds this owner's entries outlive it in the directory if it dies")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  serve_cmd->add_flag("--announce-files", serve.announce_files,
                      "announce every file under the root by name (at most 100000), its modification time in "
                      "nanoseconds as its version, so consumers take the newest replica and can ask for one "
                      "version; with --announce, those prefixes too");
  serve_cmd->add_option("--announce-rescan", serve.announce_rescan_s,
                        "with --announce-files: seconds between scans of the root (changes are announced after "
                        "the next scan)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();

  GetOptions get;
  auto* get_cmd = app.add_subcommand("get", "fetch one file from a corma serve");
  get_cmd->add_option("owner", get.owner, "HOST:PORT of the server (with --directory: the path)")->required();
  get_cmd->add_option("path", get.path, "relative path of the file on the server");
  get_cmd->add_option("-o,--output", get.output, "file to write")->required();
  get_cmd->add_option("--budget", get.budget, "registration budget for the destination")->capture_default_str();
  get_cmd->add_option("--transport", get.transport.transport, "tcp, shm (UCX) or verbs (first RDMA device)")
      ->check(CLI::IsMember(transport_names()))
      ->capture_default_str();
  get_cmd->add_flag("--trusted-peers", get.transport.trusted_peers,
                    "allow RDMA over tcp (same RISK as for serve: the server could read this process's memory)");
  get_cmd->add_flag("--no-rdma", get.no_rdma, "use the chunked path only");
  get_cmd->add_flag("--push", get.push,
                    "have the server write the file into this side's mapping of the output (a server without "
                    "--accept-push is read from instead, and the line says why)")
      ->excludes("--no-rdma");
  get_cmd->add_option("--pull-window", get.pull_window, "chunked path: pulls kept on the wire at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();

  add_directory(get_cmd, get.directory);
  get_cmd->add_option("--cluster-key", get.cluster_key_file,
                      "file holding the cluster's shared key: an owner must prove it holds it (and, through "
                      "--directory, that it is the owner the directory names) before this side offers RDMA or "
                      "asks anything; one that cannot is left for the next")
      ->check(CLI::ExistingFile);

  get_cmd->add_option("--version", get.version,
                      "with --directory: fetch this version of the file (a number its owners announce; corma ls "
                      "shows them), from an owner announcing it; none does: exit 1, object changed")
      ->needs("--directory");

  ListOptions list;
  auto* ls_cmd = app.add_subcommand("ls", "list the names (and prefixes) the directory's owners announce");
  add_directory(ls_cmd, list.directory);
  ls_cmd->get_option("--directory")->required();
  ls_cmd->add_option("prefix", list.prefix, "only names starting with this");

  auto* demo_cmd = app.add_subcommand("demo", "run an owner and consumers in one process and fetch a data set");

  CLI11_PARSE(app, argc, argv);
  if (*serve_cmd) return run_serve(serve);
  if (*get_cmd) {
    if (get.directory.address.empty() && get.path.empty()) {
      std::fprintf(stderr, "corma get: give OWNER PATH, or --directory ADDRESS PATH\n");
      return 2;
    }
    return run_get(get);
  }
  if (*ls_cmd) return run_list(list);
  if (*demo_cmd) return run_demo();
  return 2;
}
