// Rows across a real round trip: the owner in one private network
// namespace, the consumer in another, joined by a 1 Gbit/s link with a 5 ms
// round trip (tools/netfault: the fault relay, tbf, nftables loss), against
// a plain TCP stream of the same bytes over the same link. Needs root and
// the tools the link is made of; skipped, saying why, without them.
#pragma once

#include "scenarios.hpp"

#include <vector>

namespace corma::bench {

/// `file_fetch size=256MiB chunked rtt=5ms` (and `... loss=1%`): corma get
/// of a served file into a file, owner and consumer threads of this process
/// in their namespaces; `fetch_many objects=1000 size=64KiB rtt=5ms`, tcp,
/// chunked and trusted (RDMA over UCX's tcp), owner and consumer as
/// processes (corma-set-peer).
std::vector<Measurement> across_link(const Options& options);

}  // namespace corma::bench
