// A verbs backend as a contract subject, over any function table: the
// software provider in CI, libibverbs on a machine with a device.
#pragma once

#include "contract/engine_subject.hpp"

#include "provider_table.hpp"

#include <corma/verbs.hpp>

#include <memory>

namespace corma::contract {

inline verbs::Config verbs_contract_config() {
  verbs::Config config;
  config.operation_timeout = std::chrono::seconds(3);
  config.shutdown_timeout = std::chrono::seconds(2);
  return config;
}

/// `api` null: libibverbs (the real device).
inline ContractSubject make_verbs_subject(const verbs::Config& config, std::shared_ptr<const verbs::IbvApi> api) {
  auto backend = api ? verbs::create_over(config, std::move(api)) : verbs::Backend::create(config);
  return make_engine_subject(std::move(backend).value());
}

}  // namespace corma::contract
