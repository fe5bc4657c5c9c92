// A progress-thread backend (UCX, verbs: any detail::EngineBackend) as a
// contract subject: the observations and the map-delay hook they all share.
#pragma once

#include "contract/contract_subject.hpp"

#include "backend_kit/engine_core.hpp"

#include <corma/detail/engine_backend.hpp>

#include <memory>

namespace corma::contract {

inline ContractSubject make_engine_subject(std::shared_ptr<detail::EngineBackend> backend) {
  std::weak_ptr<detail::EngineBackend> weak = backend;
  ContractSubject subject;
  subject.backend = std::move(backend);
  subject.transfers_in_flight = [weak]() -> std::size_t {
    auto b = weak.lock();
    return b ? b->transfers_in_flight() : 0;
  };
  subject.set_map_delay = [weak](std::chrono::nanoseconds delay) {
    if (auto b = weak.lock()) backend_kit::core_of(*b).map_answer_delay_ns.store(delay.count());
  };
  subject.set_provider_map_hook = [weak](std::function<void(std::size_t)> hook) {
    if (auto b = weak.lock()) backend_kit::core_of(*b).provider_map_hook = std::move(hook);
  };
  subject.maps_handed_off = [weak]() -> std::size_t {
    auto b = weak.lock();
    return b ? backend_kit::core_of(*b).maps_answered.load() : 0;
  };
  return subject;
}

}  // namespace corma::contract
