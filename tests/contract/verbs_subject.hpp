// A verbs backend as a contract subject, over any function table: the
// software provider in CI, libibverbs on a machine with a device.
#pragma once

#include "contract/contract_subject.hpp"

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
  auto backend = (api ? verbs::Backend::create(config, std::move(api)) : verbs::Backend::create(config)).value();
  std::weak_ptr<verbs::Backend> weak = backend;
  ContractSubject subject;
  subject.backend = backend;
  subject.transfers_in_flight = [weak]() -> std::size_t {
    auto b = weak.lock();
    return b ? b->transfers_in_flight() : 0;
  };
  subject.set_map_delay = [weak](std::chrono::nanoseconds delay) {
    if (auto b = weak.lock()) b->set_map_answer_delay(delay);
  };
  subject.maps_handed_off = [weak]() -> std::size_t {
    auto b = weak.lock();
    return b ? b->maps_answered() : 0;
  };
  return subject;
}

}  // namespace corma::contract
