// corma-bench: corma against raw UCX in the same run, as ratios.
#include "report.hpp"
#include "scenarios.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>

int main(int argc, char** argv) {
  using namespace corma::bench;
  CLI::App app{"corma-bench: corma against raw UCX, alternating rounds in the same process"};
  Options options;
  std::string json_path, markdown_path;
  app.add_option("--transport", options.transports, "tcp and/or shm")->check(CLI::IsMember({"tcp", "shm"}));
  app.add_option("--rounds", options.rounds, "alternating rounds per point")->check(CLI::Range(1, 1000));
  app.add_option("--scale", options.bytes_scale, "scales the work per round")->check(CLI::Range(0.01, 100.0));
  app.add_option("--only", options.only,
                 "scenarios: registration arena_allocate get_bandwidth get_latency small_get_rate get_batch end_to_end_fetch fetch_many parallel_fetch put_batch get_strided put_strided atomic_latency atomic_rate put_notify_latency push_fetch directory_resolve directory_failover file_fetch across_link acquire_many registry_bookkeeping idle_cpu");
  app.add_option("--json", json_path, "write the results as JSON");
  app.add_option("--markdown", markdown_path, "write the results as a Markdown table");
  CLI11_PARSE(app, argc, argv);

  std::string command = "corma-bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  const auto machine = describe_machine(command);
  std::fprintf(stderr, "%s\n", machine.description.c_str());
  const auto results = run_scenarios(options);
  std::printf("%s", render_table(results).c_str());
  if (!json_path.empty()) std::ofstream(json_path) << render_json(results, machine) << "\n";
  if (!markdown_path.empty()) std::ofstream(markdown_path) << render_markdown(results, machine);
  return 0;
}
