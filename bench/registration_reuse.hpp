// Registrations that cost nothing the second time: a hit in the registry's
// cache and a slice of an arena, each against a bare ucp_mem_map.
#pragma once

#include "scenarios.hpp"

#include <string>

namespace corma::bench {

/// `registration size=4KiB cached`: a 4 KiB registration inside a cached
/// 64 KiB one (Registry::find_cached), then its guard dropped; against
/// ucp_mem_map and unmap of 4 KiB.
Measurement cached_registration(const Options& options, const std::string& transport);

/// `arena_allocate size=4KiB`: a 4 KiB slice taken from an arena and
/// dropped; against ucp_mem_map and unmap of 4 KiB.
Measurement arena_allocate(const Options& options, const std::string& transport);

}  // namespace corma::bench
