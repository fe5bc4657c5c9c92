// Many small objects per round trip: Consumer::async_fetch_many against raw
// UCX batched gets of the same bytes.
#pragma once

#include "scenarios.hpp"

#include <string>

namespace corma::bench {

/// `fetch_many objects=1000 size=64KiB warm` (and `size=4KiB warm arena`):
/// an owner publishing a thousand objects of `object_size` (kept registered
/// between fetches; its RDMA threshold lowered to the object size, so that
/// every object goes by RDMA) and a consumer fetching all of them with one
/// async_fetch_many into a region it keeps registered, or `into_arena` into
/// a slice of an arena each, both in this process over `transport`; against
/// raw UCX posting the same thousand gets at once and waiting for all of
/// them. Warm: one fetch before the rounds registers the exports and
/// imports their keys.
Measurement fetch_many_objects(const Options& options, const std::string& transport, std::size_t object_size,
                               bool into_arena);

}  // namespace corma::bench
