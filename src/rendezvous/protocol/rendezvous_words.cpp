// The rendezvous vocabulary every user shares: what a name may be, and
// the reasons an object came in chunks.
#include <corma/rendezvous.hpp>

namespace corma {

Result<void> check_object_name(std::string_view name) {
  if (name.empty() || name.size() > max_object_name_length) {
    return fail(errc::out_of_range, "object name of " + std::to_string(name.size()) + " bytes is outside 1.." +
                                        std::to_string(max_object_name_length));
  }
  for (std::size_t at = 0; at < name.size(); ++at) {
    const auto byte = static_cast<unsigned char>(name[at]);
    if (byte < 0x20 || byte == 0x7f) {
      return fail(errc::not_owned, "object name holds the control byte " + std::to_string(byte) + " at " +
                                       std::to_string(at) + " (names may not contain 0x00-0x1F or 0x7F)");
    }
  }
  return success();
}

std::string_view to_string(ChunkedReason reason) noexcept {
  switch (reason) {
    case ChunkedReason::budget: return "budget";
    case ChunkedReason::not_configured: return "not_configured";
    case ChunkedReason::below_threshold: return "below_threshold";
    case ChunkedReason::draining: return "draining";
    case ChunkedReason::no_offer: return "no_offer";
    case ChunkedReason::backend_mismatch: return "backend_mismatch";
    case ChunkedReason::registration_failed: return "registration_failed";
    case ChunkedReason::no_window: return "no_window";
    case ChunkedReason::rdma_failed: return "rdma_failed";
  }
  return "unknown";
}

}  // namespace corma
