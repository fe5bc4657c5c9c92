// One benchmark point: corma and raw UCX samples from alternating rounds,
// and the figures the report quotes.
#pragma once

#include <string>
#include <vector>

namespace corma::bench {

struct Measurement {
  std::string scenario;   ///< "get_bandwidth", "get_latency_8B", ...
  std::string transport;  ///< "tcp", "shm", or "-"
  std::string params;     ///< "size=1MiB window=8"
  std::string unit;       ///< "GB/s", "us", "Mops/s", "%core"
  bool higher_is_better = true;
  std::vector<double> corma;
  std::vector<double> raw;  ///< empty when there is no raw counterpart
  std::string target;       ///< the issue's target for this point, if any
  bool target_met = true;
  /// What `raw` measured: raw UCX, unless a point compares corma with
  /// another way of using corma (one consumer against eight, say).
  std::string baseline = "raw UCX";

  [[nodiscard]] double corma_median() const;
  [[nodiscard]] double corma_p99() const;
  [[nodiscard]] double raw_median() const;
  [[nodiscard]] double raw_p99() const;
  /// corma / raw, medians.
  [[nodiscard]] double ratio() const;
};

[[nodiscard]] double percentile(std::vector<double> values, double q);

}  // namespace corma::bench
