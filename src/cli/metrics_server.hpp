// Prometheus metrics over HTTP (Boost.Beast): the owner's, the registry's and
// the directory's counters as prometheus-cpp families, serialised in the
// text format.
#pragma once

#include <corma/directory.hpp>
#include <corma/owner.hpp>
#include <corma/registry.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace corma::cli {

/// The families of one owner and, when it has them, its registry and its
/// directory (announcing it, resolving for it). Each
/// scrape brings them to a snapshot: gauges take its values, counters and
/// the latency histogram advance by what it added since the last one, so
/// they never go backwards.
class OwnerMetrics {
 public:
  explicit OwnerMetrics(bool with_registry, bool with_directory = false);

  void update(const OwnerStats& owner, const RegistryStats* registry, const DirectoryStats* directory = nullptr);
  /// The text exposition format (version 0.0.4).
  [[nodiscard]] std::string render() const;

 private:
  template <class Stats>
  struct Bound {
    std::vector<std::pair<prometheus::Counter*, std::uint64_t Stats::*>> counters;
    std::vector<std::pair<prometheus::Gauge*, std::uint64_t Stats::*>> gauges;
    void update(const Stats& stats) const;
  };

  prometheus::Registry families_;
  prometheus::Family<prometheus::Counter>* decisions_ = nullptr;
  prometheus::Counter* granted_ = nullptr;
  Bound<OwnerStats> owner_;
  Bound<RegistryStats> registry_;
  Bound<DirectoryStats> directory_;
  prometheus::Gauge* announced_ = nullptr;
  prometheus::Gauge* watching_ = nullptr;
  prometheus::Histogram* latency_ = nullptr;
  LatencyHistogram last_latency_;
};

/// The metrics page for an owner and its registry and directory (either
/// may be null), from a fresh set of families.
[[nodiscard]] std::string render_metrics(const OwnerStats& owner, const RegistryStats* registry,
                                         const DirectoryStats* directory = nullptr);

/// Serves GET /metrics on `acceptor` until it is closed.
boost::asio::awaitable<void> serve_metrics(boost::asio::ip::tcp::acceptor& acceptor, const Owner& owner,
                                           const Registry* registry, const Directory* directory = nullptr);

}  // namespace corma::cli
