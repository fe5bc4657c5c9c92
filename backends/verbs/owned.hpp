// Verbs objects owned like any C++ resource: each is destroyed through the
// function table that made it, once, when its owner goes, so the engine
// keeps no "created?" flags and tears nothing down by hand. Members are
// declared, and so destroyed, in the order verbs requires: queue pairs
// before the CQ, the CQ before its channel, all before the PD and the
// device context.
//
// The regions callers map are not here: the region table shared by both
// providers (backend_kit) holds them and gives them back through
// provider_unmap, which reports a failing ibv_dereg_mr to the caller; a
// destructor could not. The one MR here is the engine's own atomic scratch
// area, which no caller maps or unmaps.
#pragma once

#include "ibv_api.hpp"

#include <memory>

namespace corma::verbs {

/// Destroys a verbs object with the table's `Destroy` entry.
template <auto Destroy>
struct IbvDestroyer {
  const IbvApi* api = nullptr;
  template <class Handle>
  void operator()(Handle* handle) const noexcept {
    if (api != nullptr) (void)(api->*Destroy)(handle);
  }
};

using OwnedContext = std::unique_ptr<ibv_context, IbvDestroyer<&IbvApi::close_device>>;
using OwnedPd = std::unique_ptr<ibv_pd, IbvDestroyer<&IbvApi::dealloc_pd>>;
using OwnedChannel = std::unique_ptr<ibv_comp_channel, IbvDestroyer<&IbvApi::destroy_comp_channel>>;
using OwnedCq = std::unique_ptr<ibv_cq, IbvDestroyer<&IbvApi::destroy_cq>>;
using OwnedQp = std::unique_ptr<ibv_qp, IbvDestroyer<&IbvApi::destroy_qp>>;
using OwnedMr = std::unique_ptr<ibv_mr, IbvDestroyer<&IbvApi::dereg_mr>>;

/// Takes ownership of `handle` (may be null), to be destroyed through `api`.
template <class Owned>
[[nodiscard]] Owned own(const IbvApi& api, typename Owned::pointer handle) noexcept {
  return Owned(handle, typename Owned::deleter_type{&api});
}

}  // namespace corma::verbs
