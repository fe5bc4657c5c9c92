// corma error codes: one enum, one category.
#pragma once

#include <string>
#include <system_error>

namespace corma {

/// Every failure corma reports carries one of these codes.
enum class errc {
  success = 0,
  shutting_down,     ///< the component is closing; nothing new is admitted
  budget_exceeded,   ///< the registry's byte budget has no room for the request
  region_not_found,  ///< unknown, deregistering or already deregistered region
  out_of_range,      ///< null, empty, overflowing or out-of-bounds range
  invalid_key,       ///< a packed remote key or descriptor that cannot be trusted
  backend,           ///< the provider (UCX, verbs) reported a failure
  not_configured,    ///< the requested capability is absent or switched off
  not_owned,         ///< the caller does not own what it tried to use
  timeout,           ///< a deadline passed before the operation finished
  cancelled,         ///< the caller cancelled the operation
  peer_unreachable,  ///< the peer is unknown, broken or gone
  protocol,          ///< a peer sent something the protocol does not allow
  object_changed,    ///< the object changed while it was read: no consistent version was delivered
};

/// The category of corma::errc; its name() is "corma".
[[nodiscard]] const std::error_category& error_category() noexcept;

/// Found by ADL so `std::error_code ec = errc::timeout;` works.
[[nodiscard]] inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// Whether retrying the same request later can succeed (budget freed, peer
/// back, deadline longer). Unknown codes from other categories say no.
[[nodiscard]] bool is_retryable(std::error_code ec) noexcept;
[[nodiscard]] inline bool is_retryable(errc e) noexcept { return is_retryable(make_error_code(e)); }

}  // namespace corma

template <>
struct std::is_error_code_enum<corma::errc> : std::true_type {};
