// The standard benchmark set.
#pragma once

#include "measurement.hpp"

#include <string>
#include <vector>

namespace corma::bench {

struct Options {
  std::vector<std::string> transports{"tcp", "shm"};
  int rounds = 7;           ///< alternating corma / raw rounds per point
  double bytes_scale = 1;   ///< scales the bytes moved per round
  std::vector<std::string> only;  ///< scenario names to run; empty = all
};

/// Runs every selected scenario; prints progress to stderr.
std::vector<Measurement> run_scenarios(const Options& options);

}  // namespace corma::bench
