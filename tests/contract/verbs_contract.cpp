// The backend contract suite, instantiated for the verbs backend over the
// software verbs provider (tests/support/soft_verbs.*), which runs in CI.
// verbs_hardware_contract.cpp runs the same suite on a real device.
#include "contract/backend_contract.hpp"
#include "contract/verbs_subject.hpp"
#include "support/soft_verbs.hpp"

namespace corma::contract {
namespace {

ContractSubject make_soft() {
  auto& fabric = testing::SoftVerbs::instance();
  auto subject = make_verbs_subject(verbs_contract_config(), fabric.api());
  subject.set_transfer_delay = [&fabric](std::chrono::nanoseconds delay) { fabric.set_work_delay(delay); };
  return subject;
}

INSTANTIATE_TEST_SUITE_P(Verbs, BackendContract,
                         ::testing::Values(ContractParam{"soft", &make_soft, std::chrono::seconds(5), {}}),
                         ContractParamName{});

}  // namespace
}  // namespace corma::contract
