#include "report.hpp"

#include <nlohmann/json.hpp>

#include <sys/utsname.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace corma::bench {

namespace {

std::string number(double value) {
  if (std::isnan(value)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, value >= 100 ? "%.0f" : value >= 10 ? "%.1f" : value >= 1 ? "%.2f" : "%.3f", value);
  return text;
}

std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

std::string verdict(const Measurement& m) {
  if (m.target.empty()) return "";
  return (m.target_met ? "met: " : "MISSED: ") + m.target;
}

}  // namespace

Machine describe_machine(const std::string& command) {
  utsname name{};
  ::uname(&name);
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE)) /
                        (1024.0 * 1024 * 1024);
  char text[512];
  std::snprintf(text, sizeof text, "%s, %ld cores, %.0f GiB, Linux %s, UCX %s", cpu_model().c_str(), cores, memory,
                name.release, "1.13.1");
  return Machine{text, command};
}

std::string render_table(const std::vector<Measurement>& results) {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %-4s %-26s %-7s %10s %10s %10s %10s %7s  %s\n", "scenario", "tl", "params",
                "unit", "corma p50", "corma p99", "raw p50", "raw p99", "ratio", "target");
  out << line;
  for (const auto& m : results) {
    std::snprintf(line, sizeof line, "%-20s %-4s %-26s %-7s %10s %10s %10s %10s %7s  %s\n", m.scenario.c_str(),
                  m.transport.c_str(), m.params.c_str(), m.unit.c_str(), number(m.corma_median()).c_str(),
                  number(m.corma_p99()).c_str(), m.raw.empty() ? "-" : number(m.raw_median()).c_str(),
                  m.raw.empty() ? "-" : number(m.raw_p99()).c_str(), number(m.ratio()).c_str(), verdict(m).c_str());
    out << line;
  }
  return out.str();
}

std::string render_markdown(const std::vector<Measurement>& results, const Machine& machine) {
  std::ostringstream out;
  out << "Machine: " << machine.description << "  \nCommand: `" << machine.command << "`\n\n";
  out << "| scenario | transport | parameters | unit | corma p50 | corma p99 | raw p50 | raw p99 | corma/raw | target |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& m : results) {
    out << "| " << m.scenario << " | " << m.transport << " | " << m.params << " | " << m.unit << " | "
        << number(m.corma_median()) << " | " << number(m.corma_p99()) << " | "
        << (m.raw.empty() ? "-" : number(m.raw_median())) << " | " << (m.raw.empty() ? "-" : number(m.raw_p99()))
        << " | " << number(m.ratio()) << " | " << verdict(m) << " |\n";
  }
  out << "\np99 is the 99th percentile for times and the 1st percentile (the slow tail) for rates.\n";
  return out.str();
}

std::string render_json(const std::vector<Measurement>& results, const Machine& machine) {
  nlohmann::json doc;
  doc["machine"] = machine.description;
  doc["command"] = machine.command;
  for (const auto& m : results) {
    nlohmann::json point{{"scenario", m.scenario},
                         {"transport", m.transport},
                         {"params", m.params},
                         {"unit", m.unit},
                         {"higher_is_better", m.higher_is_better},
                         {"corma", {{"p50", m.corma_median()}, {"p99", m.corma_p99()}, {"samples", m.corma}}}};
    if (!m.raw.empty()) {
      point["raw"] = {{"p50", m.raw_median()}, {"p99", m.raw_p99()}, {"samples", m.raw}};
      point["baseline"] = m.baseline;
      point["ratio"] = m.ratio();
    }
    if (!m.target.empty()) point["target"] = {{"rule", m.target}, {"met", m.target_met}};
    doc["results"].push_back(point);
  }
  return doc.dump(2);
}

}  // namespace corma::bench
