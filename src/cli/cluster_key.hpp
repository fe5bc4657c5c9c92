// The cluster key of `--cluster-key FILE`: owners prove with it who they
// are, and consumers check their proof (OwnerConfig/ConsumerConfig::
// cluster_key). The key is the file's bytes, all of them, as they are.
#pragma once

#include <corma/error.hpp>

#include <string>

namespace corma::cli {

/// The key in `file`: `not_configured` when it cannot be read,
/// `out_of_range` when it is shorter than min_cluster_key_size or longer
/// than 4 KiB (a key, not a file).
[[nodiscard]] Result<std::string> read_cluster_key(const std::string& file);

}  // namespace corma::cli
