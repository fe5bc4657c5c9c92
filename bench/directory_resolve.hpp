// Resolving names through the directory (etcd), cached and not.
#pragma once

#include "scenarios.hpp"

#include <vector>

namespace corma::bench {

/// `directory_resolve names=10000 cached` and `uncached`: one owner
/// announces 10,000 names in a private etcd; a consumer's Directory
/// resolves names at random, from its watched cache (after one pass that
/// fills it) or asking etcd every time (no watch, no cache). Microseconds
/// per resolution; no raw counterpart (reported, no target yet). Empty when
/// this machine has no etcd.
std::vector<Measurement> directory_resolve(const Options& options);

}  // namespace corma::bench
