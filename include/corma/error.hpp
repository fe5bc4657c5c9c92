// corma::Error and corma::Result<T>: the value every operation completes with.
#pragma once

#include <corma/errc.hpp>

#include <boost/outcome/std_result.hpp>
#include <boost/outcome/try.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <system_error>

namespace corma {

/// The byte figures behind a budget refusal, so a caller can decide what to
/// evict or whether to fall back to the chunked path.
struct BudgetFigures {
  std::uint64_t requested = 0;   ///< bytes the refused request would charge
  std::uint64_t registered = 0;  ///< bytes charged when it was refused
  std::uint64_t budget = 0;      ///< the registry's budget
  friend bool operator==(const BudgetFigures&, const BudgetFigures&) = default;
};

/// A failure: the code says what kind, the detail says what happened.
struct Error {
  std::error_code code;
  std::string detail;
  std::optional<BudgetFigures> budget;
  /// The provider's own code behind `code`, when it has one (the verbs
  /// backend: an ibv_wc_status in verbs::completion_category()). `code` stays
  /// a corma::errc, so callers can branch on it without knowing the provider.
  std::error_code cause;

  Error() = default;
  Error(std::error_code c, std::string d = {}, std::optional<BudgetFigures> b = {})
      : code(c), detail(std::move(d)), budget(b) {}
  Error(errc c, std::string d = {}, std::optional<BudgetFigures> b = {})  // NOLINT
      : code(make_error_code(c)), detail(std::move(d)), budget(b) {}

  /// "corma: <message>: <detail>" plus the budget figures when present.
  [[nodiscard]] std::string message() const;

  [[nodiscard]] bool is(errc c) const noexcept { return code == make_error_code(c); }
  [[nodiscard]] bool retryable() const noexcept { return is_retryable(code); }
};

/// Outcome's custom-payload hook: `.value()` on a failed Result throws
/// std::system_error carrying this code (and the detail as its what()).
[[nodiscard]] inline const std::error_code& make_error_code(const Error& e) noexcept {
  return e.code;
}
[[noreturn]] void outcome_throw_as_system_error_with_payload(const Error& e);

[[nodiscard]] inline bool is_retryable(const Error& e) noexcept { return e.retryable(); }

template <class T, class E = Error>
using Result = boost::outcome_v2::std_result<T, E>;

using boost::outcome_v2::success;

/// Shorthand for the common `return fail(errc::x, "why")`.
[[nodiscard]] inline auto fail(errc c, std::string detail = {}) {
  return boost::outcome_v2::failure(Error{c, std::move(detail)});
}

}  // namespace corma

/// Early-return on failure inside functions returning corma::Result.
#define CORMA_TRY BOOST_OUTCOME_TRY
/// The same inside coroutines.
#define CORMA_CO_TRY BOOST_OUTCOME_CO_TRY
