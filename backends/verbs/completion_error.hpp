// Failed work completions as errors: codes in verbs::completion_category()
// (value = ibv_wc_status), text from the provider's ibv_wc_status_str.
#pragma once

#include "ibv_api.hpp"

#include <corma/error.hpp>
#include <corma/verbs.hpp>

namespace corma::verbs {

/// Lets completion_category() name statuses with the provider's own text.
void use_status_text(const IbvApi& api) noexcept;

/// `what` failed with this completion: `backend`, or `peer_unreachable` when
/// the peer stopped answering, with the status as Error::cause; the detail
/// says what, the status text and the vendor error.
[[nodiscard]] Error completion_error(const ibv_wc& wc, const std::string& what);

}  // namespace corma::verbs
