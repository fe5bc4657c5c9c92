// One consumer's small fetches while another's first fetch of a large,
// cold file runs: what an owner's event loop costs its other clients when
// a file has to come from the disk.
#pragma once

#include "scenarios.hpp"

namespace corma::bench {

/// `small_fetch_while_cold size=1GiB` (tcp): the latencies (ms) of 4 KiB
/// fetches on one connection while another consumer's first fetch of a
/// 1 GiB file, dropped from the page cache, runs (corma), against the same
/// fetches with nothing else running (the baseline). Both served by corma
/// serve's resolver, reading files on its file threads. Target: p99 ≤ 5 ms.
Measurement small_fetch_while_cold(const Options& options);

}  // namespace corma::bench
