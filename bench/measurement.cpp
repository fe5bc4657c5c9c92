#include "measurement.hpp"

#include <algorithm>
#include <cmath>

namespace corma::bench {

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const double rank = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const auto hi = static_cast<std::size_t>(std::ceil(rank));
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

double Measurement::corma_median() const { return percentile(corma, 0.5); }
double Measurement::corma_p99() const { return percentile(corma, higher_is_better ? 0.01 : 0.99); }
double Measurement::raw_median() const { return percentile(raw, 0.5); }
double Measurement::raw_p99() const { return percentile(raw, higher_is_better ? 0.01 : 0.99); }
double Measurement::ratio() const { return raw.empty() ? std::nan("") : corma_median() / raw_median(); }

}  // namespace corma::bench
