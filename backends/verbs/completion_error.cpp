#include "completion_error.hpp"

#include <atomic>
#include <cstdio>
#include <string>

namespace corma::verbs {
namespace {

using StatusText = const char* (*)(ibv_wc_status);
std::atomic<StatusText> g_status_text{nullptr};

class CompletionCategory final : public std::error_category {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "ibv_wc_status"; }
  [[nodiscard]] std::string message(int value) const override {
    if (auto text = g_status_text.load(std::memory_order_acquire)) return text(static_cast<ibv_wc_status>(value));
    return "work completion status " + std::to_string(value);
  }
};

}  // namespace

const std::error_category& completion_category() noexcept {
  static const CompletionCategory category;
  return category;
}

void use_status_text(const IbvApi& api) noexcept { g_status_text.store(api.wc_status_str, std::memory_order_release); }

Error completion_error(const ibv_wc& wc, const std::string& what) {
  const std::error_code cause(static_cast<int>(wc.status), completion_category());
  const bool peer_silent = wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_RNR_RETRY_EXC_ERR;
  char vendor[32];
  std::snprintf(vendor, sizeof vendor, " (vendor error 0x%x)", wc.vendor_err);
  Error error{peer_silent ? errc::peer_unreachable : errc::backend, "verbs: " + what + ": " + cause.message() + vendor};
  error.cause = cause;
  return error;
}

}  // namespace corma::verbs
