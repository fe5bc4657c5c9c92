// Fetches at once on one connection: one Consumer running eight fetches
// together against eight Consumers running one each.
#pragma once

#include "scenarios.hpp"

#include <string>

namespace corma::bench {

/// `parallel_fetch consumers=1 fetches=8 size=1MiB warm`: an owner
/// publishing eight 1 MiB objects (kept registered between fetches), and
/// eight async_fetch_into running at once, each into a region kept
/// registered, over one consumer; the baseline is the same eight fetches
/// over eight consumers (eight connections), all in this process over
/// `transport`. Warm: one round of each before the measured ones.
Measurement parallel_fetch(const Options& options, const std::string& transport);

}  // namespace corma::bench
