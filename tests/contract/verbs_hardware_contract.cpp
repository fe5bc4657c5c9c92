// The backend contract suite on the first real RDMA device, through
// libibverbs (label "hardware": `ctest -L hardware`). Without a device, or
// without kernel support, every test skips and prints why.
#include "contract/backend_contract.hpp"
#include "contract/verbs_subject.hpp"

#include <cstdlib>

namespace corma::contract {
namespace {

verbs::Config hardware_config() {
  auto config = verbs_contract_config();
  // CORMA_VERBS_DEVICE / CORMA_VERBS_GID_INDEX pick a device and GID on
  // machines with several.
  if (const char* device = std::getenv("CORMA_VERBS_DEVICE")) config.device = device;
  if (const char* gid = std::getenv("CORMA_VERBS_GID_INDEX")) config.gid_index = std::atoi(gid);
  return config;
}

ContractSubject make_hardware() { return make_verbs_subject(hardware_config(), nullptr); }

std::optional<std::string> no_device() {
  auto probe = verbs::Backend::create(hardware_config());
  if (probe) return std::nullopt;
  return "no usable RDMA device here: " + probe.error().message();
}

INSTANTIATE_TEST_SUITE_P(VerbsHardware, BackendContract,
                         ::testing::Values(ContractParam{"device", &make_hardware, std::chrono::seconds(10),
                                                         &no_device, true, "verbs-device"}),
                         ContractParamName{});

}  // namespace
}  // namespace corma::contract
