// The benchmark's outputs: a table for people, JSON for tools, Markdown for docs.
#pragma once

#include "measurement.hpp"

#include <string>
#include <vector>

namespace corma::bench {

struct Machine {
  std::string description;  ///< CPU model, cores, memory, kernel
  std::string command;      ///< how the results were produced
};

[[nodiscard]] Machine describe_machine(const std::string& command);
[[nodiscard]] std::string render_table(const std::vector<Measurement>& results);
[[nodiscard]] std::string render_markdown(const std::vector<Measurement>& results, const Machine& machine);
[[nodiscard]] std::string render_json(const std::vector<Measurement>& results, const Machine& machine);

}  // namespace corma::bench
