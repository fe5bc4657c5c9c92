// What one name costs the owner in a batch: the look-up of a file it keeps,
// the lease, and the name's answer.
#pragma once

#include "scenarios.hpp"

namespace corma::bench {

/// `acquire_many names=251 cached` (tcp, chunked answers): an owner serving
/// a directory through corma serve's resolver on a thread of its own, and a
/// raw client asking for 251 small files it keeps in one acquire_many,
/// against the same request naming one of them. The row is the difference
/// per extra name, in microseconds, the round trip and the frames' fixed
/// costs taken out (the release of each batch is not timed). Target: at
/// most 2 us per name.
Measurement owner_name_cost(const Options& options);

}  // namespace corma::bench
