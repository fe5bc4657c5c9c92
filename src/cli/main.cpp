// corma: serve files over the rendezvous, fetch them, or run the demo.
#include "commands.hpp"

#include <CLI/CLI.hpp>

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
                        "memory for the snapshots of files being served (each version read once, shared)")
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
  serve_cmd->add_option("--idle-timeout", serve.idle_timeout_s,
                        "seconds a connection may stay silent between requests before it is closed")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();

  GetOptions get;
  auto* get_cmd = app.add_subcommand("get", "fetch one file from a corma serve");
  get_cmd->add_option("owner", get.owner, "HOST:PORT of the server")->required();
  get_cmd->add_option("path", get.path, "relative path of the file on the server")->required();
  get_cmd->add_option("-o,--output", get.output, "file to write")->required();
  get_cmd->add_option("--budget", get.budget, "registration budget for the destination")->capture_default_str();
  get_cmd->add_option("--transport", get.transport.transport, "tcp, shm (UCX) or verbs (first RDMA device)")
      ->check(CLI::IsMember(transport_names()))
      ->capture_default_str();
  get_cmd->add_flag("--trusted-peers", get.transport.trusted_peers,
                    "allow RDMA over tcp (same RISK as for serve: the server could read this process's memory)");
  get_cmd->add_flag("--no-rdma", get.no_rdma, "use the chunked path only");
  get_cmd->add_option("--pull-window", get.pull_window, "chunked path: pulls kept on the wire at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();

  auto* demo_cmd = app.add_subcommand("demo", "run an owner and consumers in one process and fetch a data set");

  CLI11_PARSE(app, argc, argv);
  if (*serve_cmd) return run_serve(serve);
  if (*get_cmd) return run_get(get);
  if (*demo_cmd) return run_demo();
  return 2;
}
