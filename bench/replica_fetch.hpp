// A set fetched through the directory from three replicas, against the
// same set from one owner.
#pragma once

#include "scenarios.hpp"

#include <optional>

namespace corma::bench {

/// `fetch_many objects=1000 size=64KiB warm replicas=3` (tcp): three owners
/// each publishing the same 1000 objects of 64 KiB (exports kept
/// registered) and announcing them in a private etcd; a ClusterConsumer's
/// async_fetch_many into one region kept registered, spread over the three;
/// the baseline is the same fetch_many from one of the owners over one
/// Consumer. Both run on the first owner's io_context thread. Warm: one set
/// of each before the measured ones. Nothing when this machine has no etcd.
std::optional<Measurement> fetch_many_replicas(const Options& options);

}  // namespace corma::bench
