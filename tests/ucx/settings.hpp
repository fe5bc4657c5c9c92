// The UCX configurations that make peers, for parameterised tests: shared
// memory, and trusted tcp restricted to loopback.
#pragma once

#include <corma/ucx.hpp>

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

namespace corma::testing {

struct UcxSetting {
  const char* name;
  ucx::Config config;
};

/// gtest prints parameters with this (found by ADL).
inline void PrintTo(const UcxSetting& setting, std::ostream* os) { *os << setting.name; }

inline std::vector<UcxSetting> ucx_peer_settings() {
  return {{"shm", {.transport = ucx::Transport::shared_memory, .error_handling = ucx::ErrorHandling::none}},
          {"tcp_lo", {.transport = ucx::Transport::tcp, .trusted_peers = true, .tcp_interface = "lo"}}};
}

/// Names instantiated tests after UcxSetting::name.
struct UcxSettingName {
  std::string operator()(const ::testing::TestParamInfo<UcxSetting>& param) const { return param.param.name; }
};

/// A backend, or an exception saying why UCX would not make it.
inline std::shared_ptr<ucx::Backend> make_ucx(const ucx::Config& config) {
  auto backend = ucx::Backend::create(config);
  if (!backend) throw std::runtime_error(backend.error().message());
  return std::move(backend).value();
}

}  // namespace corma::testing
