// What keeping many leases alive costs a connection on the wire.
#pragma once

#include "scenarios.hpp"

namespace corma::bench {

/// `renew_traffic leases=512`: the frames per second one connection sends
/// to keep 512 leases alive (512 fetches whose RDMA gets are held, owner
/// and consumer in this process over the test backend, lease timeout 3 s):
/// with the connection's heartbeat (protocol version 4), against a consumer
/// pinned to version 3, which renews each lease with a frame of its own.
/// Target: at most 2 frames per second.
Measurement renew_traffic(const Options& options);

}  // namespace corma::bench
