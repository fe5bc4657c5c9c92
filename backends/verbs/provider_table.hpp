// Creating a verbs backend over a given function table instead of the
// libibverbs it loads itself: how tests drive the backend through a software
// provider. Not installed: the table's type (ibv_api.hpp) is private.
#pragma once

#include "ibv_api.hpp"

#include <corma/verbs.hpp>

#include <memory>

namespace corma::verbs {

[[nodiscard]] Result<std::shared_ptr<Backend>> create_over(const Config& config,
                                                           std::shared_ptr<const IbvApi> api);

}  // namespace corma::verbs
