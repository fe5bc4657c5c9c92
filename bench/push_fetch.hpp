// The rendezvous push path: the owner writes an object into memory the
// consumer offers, against a raw UCX put of the same bytes.
#pragma once

#include "scenarios.hpp"

#include <string>

namespace corma::bench {

/// `push_fetch size=1MiB warm`: an owner (taking pushes) publishing one
/// 1 MiB object, kept registered, and async_push_fetch into a landing the
/// consumer keeps registered, one after the other; the baseline is a raw
/// UCX put of 1 MiB and the flush that completes it, one after the other,
/// between two workers of this process over `transport`. Warm: the push
/// peer is set up and the object registered by one push before the
/// measured ones.
Measurement push_fetch(const Options& options, const std::string& transport);

}  // namespace corma::bench
