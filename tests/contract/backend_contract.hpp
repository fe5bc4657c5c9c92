// The backend contract suite (docs/architecture.md), declared here so that
// each backend instantiates it from its own source:
//
//   #include "contract/backend_contract.hpp"
//   INSTANTIATE_TEST_SUITE_P(Ucx, BackendContract,
//                            ::testing::Values(ContractParam{"tcp", make_tcp, 2s}),
//                            ContractParamName{});
//
// and links the `corma_contract_suite` object library (tests/CMakeLists.txt,
// `corma_add_contract_test`). The tests live in contract_test.cpp.
#pragma once

#include "contract/contract_subject.hpp"

#include <gtest/gtest.h>

namespace corma::contract {

class BackendContract : public ::testing::TestWithParam<ContractParam> {
 protected:
  void SetUp() override {
    if (!GetParam().unavailable) return;
    if (auto why = GetParam().unavailable()) GTEST_SKIP() << *why;
  }
};

}  // namespace corma::contract
