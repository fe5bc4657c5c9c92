// The backend contract suite, instantiated for UCX over tcp (peer error
// handling, trusted peers so RMA is on, loopback only) and over shared memory
// (error handling none). The initiator is the reader that connects; the
// target only accepts.
#include "contract/backend_contract.hpp"
#include "contract/engine_subject.hpp"

#include <corma/ucx.hpp>

#include <memory>

namespace corma::contract {
namespace {

ContractSubject make_ucx_subject(ucx::Config config) {
  return make_engine_subject(ucx::Backend::create(config).value());
}

ContractSubject make_tcp() {
  return make_ucx_subject({.transport = ucx::Transport::tcp,
                           .error_handling = ucx::ErrorHandling::peer,
                           .operation_timeout = std::chrono::seconds(3),
                           .shutdown_timeout = std::chrono::seconds(2),
                           .trusted_peers = true,
                           .tcp_interface = "lo"});
}

ContractSubject make_shm() {
  return make_ucx_subject({.transport = ucx::Transport::shared_memory,
                           .error_handling = ucx::ErrorHandling::none,
                           .operation_timeout = std::chrono::seconds(2),
                           .shutdown_timeout = std::chrono::seconds(2)});
}

INSTANTIATE_TEST_SUITE_P(Ucx, BackendContract,
                         ::testing::Values(ContractParam{"tcp", &make_tcp, std::chrono::seconds(5), {}, true, "ucx-tcp"},
                                           ContractParam{"shm", &make_shm, std::chrono::seconds(5), {}, false, "ucx-shm"}),
                         ContractParamName{});

}  // namespace
}  // namespace corma::contract
