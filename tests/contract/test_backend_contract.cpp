// The backend contract suite, instantiated for the in-process TestBackend.
#include "contract/backend_contract.hpp"
#include "support/test_backend.hpp"

#include <memory>

namespace corma::contract {
namespace {

using corma::testing::TestBackend;
using corma::testing::TestBackendFaults;

ContractSubject make_test_subject() {
  auto backend = TestBackend::create();
  std::weak_ptr<TestBackend> weak = backend;
  // set_faults replaces every fault at once: keep the ones set so far.
  auto faults = std::make_shared<TestBackendFaults>();

  ContractSubject subject;
  subject.backend = backend;
  subject.transfers_in_flight = [weak]() -> std::size_t {
    auto b = weak.lock();
    return b ? b->transfers_in_flight() : 0;
  };
  subject.set_map_delay = [weak, faults](std::chrono::nanoseconds delay) {
    faults->map_delay = delay;
    if (auto b = weak.lock()) b->set_faults(*faults);
  };
  subject.maps_handed_off = [weak]() -> std::size_t {
    auto b = weak.lock();
    return b ? b->maps_handed_off() : 0;
  };
  subject.set_transfer_delay = [weak, faults](std::chrono::nanoseconds delay) {
    faults->transfer_delay = delay;
    if (auto b = weak.lock()) b->set_faults(*faults);
  };
  return subject;
}

INSTANTIATE_TEST_SUITE_P(TestBackend, BackendContract,
                         ::testing::Values(ContractParam{"test", &make_test_subject, std::chrono::seconds(2), {}, true, "test"}),
                         ContractParamName{});

}  // namespace
}  // namespace corma::contract
