// The backend contract suite, instantiated for the verbs backend over the
// software verbs provider (tests/support/soft_verbs.*), which runs in CI.
// verbs_hardware_contract.cpp runs the same suite on a real device.
#include "contract/backend_contract.hpp"
#include "contract/verbs_subject.hpp"
#include "support/soft_verbs.hpp"

namespace corma::contract {
namespace {

// The port looks like a ConnectX one: 1 GiB messages. Chunking into several
// work requests is exercised by tests/verbs/verbs_backend_test.cpp; here a
// transfer delay (per work request in the provider) then stays per transfer.
const bool soft_port_configured = [] {
  testing::SoftVerbs::instance().reset(testing::SoftVerbsConfig{.max_msg_sz = 1U << 30});
  return true;
}();

ContractSubject make_soft() {
  auto& fabric = testing::SoftVerbs::instance();
  auto subject = make_verbs_subject(verbs_contract_config(), fabric.api());
  subject.set_transfer_delay = [&fabric](std::chrono::nanoseconds delay) { fabric.set_work_delay(delay); };
  return subject;
}

INSTANTIATE_TEST_SUITE_P(Verbs, BackendContract,
                         ::testing::Values(ContractParam{"soft", &make_soft, std::chrono::seconds(5), {}, true, "verbs-soft"}),
                         ContractParamName{});

}  // namespace
}  // namespace corma::contract
