// Fetching through the directory past owners that cannot serve.
#pragma once

#include "scenarios.hpp"

#include <vector>

namespace corma::bench {

/// `directory_failover bad_entries=100`: in a private etcd, a 4 KiB object
/// whose name 100 owners rank before the one that serves it: 50 entries no
/// consumer can use (a host that is not an IP address, a load of 1e308)
/// and 50 well-formed entries of owners that are gone (their ports closed).
/// Each sample is a fresh ClusterConsumer (nothing cached) resolving the
/// name and fetching the object, in milliseconds; target: at most 50 ms.
/// Empty when this machine has no etcd.
std::vector<Measurement> directory_failover(const Options& options);

}  // namespace corma::bench
