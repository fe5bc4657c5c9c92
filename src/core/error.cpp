#include <corma/error.hpp>

#include <string>

namespace corma {
namespace {

class ErrorCategory final : public std::error_category {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "corma"; }

  [[nodiscard]] std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::success: return "success";
      case errc::shutting_down: return "shutting down";
      case errc::budget_exceeded: return "registration budget exceeded";
      case errc::region_not_found: return "region not found";
      case errc::out_of_range: return "range out of bounds";
      case errc::invalid_key: return "invalid remote key";
      case errc::backend: return "backend failure";
      case errc::not_configured: return "not configured";
      case errc::not_owned: return "not owned by the caller";
      case errc::timeout: return "timed out";
      case errc::cancelled: return "cancelled";
      case errc::peer_unreachable: return "peer unreachable";
      case errc::protocol: return "protocol violation";
      case errc::object_changed: return "object changed while it was read";
    }
    return "unknown corma error " + std::to_string(value);
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const ErrorCategory category;
  return category;
}

bool is_retryable(std::error_code ec) noexcept {
  if (ec.category() != error_category()) return false;
  switch (static_cast<errc>(ec.value())) {
    // Capacity and liveness problems can clear up by themselves.
    case errc::budget_exceeded:
    case errc::timeout:
    case errc::peer_unreachable:
    case errc::cancelled:
    case errc::object_changed:  // the next read sees one version
      return true;
    // Everything else fails the same way again until the request changes.
    default:
      return false;
  }
}

std::string Error::message() const {
  std::string text = code.category().name();
  text += ": ";
  text += code.message();
  if (!detail.empty()) {
    text += ": ";
    text += detail;
  }
  if (budget) {
    text += " (requested " + std::to_string(budget->requested) + " B, registered " +
            std::to_string(budget->registered) + " B of a " + std::to_string(budget->budget) +
            " B budget)";
  }
  return text;
}

void outcome_throw_as_system_error_with_payload(const Error& e) {
  throw std::system_error(e.code, e.detail);
}

}  // namespace corma
