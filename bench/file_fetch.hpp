// Serving files: corma serve's resolver and the chunked path against a
// plain TCP stream of the same file.
#pragma once

#include "scenarios.hpp"

namespace corma::bench {

/// `file_fetch size=256MiB chunked`: a file served by corma serve's resolver
/// (owner on a thread of its own, no registry: the chunked path), fetched by
/// a consumer on another thread and written to the file chunk by chunk, as
/// `corma get` does;
/// against a plain TCP stream of the same file into a file (sender with
/// sendfile, receiver writing the file). Warm: one fetch before the rounds
/// leaves the version's snapshot in the owner's cache.
Measurement file_fetch_chunked(const Options& options);

/// `file_fetch size=256MiB rdma budget=64MiB` (shm): the same file fetched
/// over RDMA from a server whose 64 MiB budget cannot hold it (lent in
/// windows), against the same fetch from a server whose budget holds it
/// whole. Both write the output file as corma get does.
Measurement file_fetch_windows(const Options& options);

}  // namespace corma::bench
