// The backend contract suite, instantiated for UCX over tcp (peer error
// handling, trusted peers so RMA is on) and over shared memory (error
// handling none).
#include "contract/backend_contract.hpp"

#include <corma/ucx.hpp>

#include <memory>

namespace corma::contract {
namespace {

ContractSubject make_ucx_subject(ucx::Config config) {
  auto backend = ucx::Backend::create(config).value();
  std::weak_ptr<ucx::Backend> weak = backend;
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

ContractSubject make_tcp() {
  return make_ucx_subject({.transport = ucx::Transport::tcp,
                           .error_handling = ucx::ErrorHandling::peer,
                           .operation_timeout = std::chrono::seconds(3),
                           .shutdown_timeout = std::chrono::seconds(2),
                           .trusted_peers = true});
}

ContractSubject make_shm() {
  return make_ucx_subject({.transport = ucx::Transport::shared_memory,
                           .error_handling = ucx::ErrorHandling::none,
                           .operation_timeout = std::chrono::seconds(2),
                           .shutdown_timeout = std::chrono::seconds(2)});
}

INSTANTIATE_TEST_SUITE_P(Ucx, BackendContract,
                         ::testing::Values(ContractParam{"tcp", &make_tcp, std::chrono::seconds(5), {}},
                                           ContractParam{"shm", &make_shm, std::chrono::seconds(5), {}}),
                         ContractParamName{});

}  // namespace
}  // namespace corma::contract
