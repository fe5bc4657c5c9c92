// Many small objects per round trip: Consumer::async_fetch_many against raw
// UCX batched gets of the same bytes.
#pragma once

#include "scenarios.hpp"

#include <string>

namespace corma::bench {

/// `fetch_many objects=1000 size=64KiB warm`: an owner publishing a thousand
/// 64 KiB objects (kept registered between fetches) and a consumer fetching
/// all of them with one async_fetch_many into a region it keeps registered,
/// both in this process over `transport`; against raw UCX posting the same
/// thousand gets at once and waiting for all of them. Warm: one fetch before
/// the rounds registers the exports and imports their keys.
Measurement fetch_many_objects(const Options& options, const std::string& transport);

}  // namespace corma::bench
