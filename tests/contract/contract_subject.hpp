// What the shared backend contract suite needs from a backend under test:
// the RdmaBackend seam itself plus a few observations and fault hooks. Each
// backend (the in-process TestBackend, UCX, verbs...) provides one
// ContractParam per configuration in its own instantiation source; the tests
// (contract_test.cpp) only ever use the seam and these fields.
#pragma once

#include <corma/backend.hpp>

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

namespace corma::contract {

/// One backend under test. Every field but `backend` may be left empty where
/// the backend cannot provide it: the tests that need it then skip (saying
/// why) or leave out the check that needs it.
struct ContractSubject {
  std::shared_ptr<RdmaBackend> backend;

  /// Transfers accepted and not yet finished on the provider, including those
  /// whose caller was already answered `cancelled`. Called from the test
  /// thread only.
  std::function<std::size_t()> transfers_in_flight;

  /// Delay between the provider registering a map and the answer being
  /// delivered: the "mapped but not answered" window.
  std::function<void(std::chrono::nanoseconds)> set_map_delay;

  /// Optional. Map results handed to their handlers' executors so far,
  /// counted once the hand-off call has returned (the result is in the
  /// executor's queue and the backend no longer touches that executor): how
  /// a test knows a result is waiting in an io_context that will never run it.
  std::function<std::size_t()> maps_handed_off;

  /// Optional. Delay between a transfer being admitted and its bytes moving:
  /// widens the "transfer in flight" window, so cancellation and unmap
  /// ordering are exercised even on a backend whose transfers are instant.
  std::function<void(std::chrono::nanoseconds)> set_transfer_delay;

  /// Optional. Installs `hook`, run with a map's length just before the
  /// provider registers it, on whichever thread registers it (an empty
  /// function removes it): a hook that waits stands for a provider slow to
  /// register a large region. Called only while no map is under way.
  std::function<void(std::function<void(std::size_t)>)> set_provider_map_hook;
};

/// One backend configuration the suite is instantiated for.
struct ContractParam {
  /// Shown in test names: letters, digits and underscores.
  std::string name;
  /// Each call makes a fresh, independent backend.
  std::function<ContractSubject()> make;
  /// How long a caller may wait to be answered after its peer dies.
  std::chrono::milliseconds peer_failure_limit{std::chrono::seconds(5)};
  /// Optional. Why this configuration cannot run here (no device, say): each
  /// test then skips, printing the reason.
  std::function<std::optional<std::string>()> unavailable;
  /// Whether the provider can end a transfer whose peer died. When it
  /// cannot (UCX over shared memory), the transfer is still answered within
  /// peer_failure_limit, but its local region stays registered (an unmap
  /// waits) until the backend shuts down.
  bool ends_dead_peer_transfers = true;
  /// The name tests/programs/progress_mix.cpp knows this configuration by
  /// (the progress-executor mix runs it in a child process); empty: none.
  std::string progress_mix;
};

/// gtest prints parameters with this (found by ADL).
inline void PrintTo(const ContractParam& param, std::ostream* os) {
  *os << "ContractParam{" << param.name << ", peer_failure_limit=" << param.peer_failure_limit.count()
      << "ms}";
}

/// Names instantiated tests after ContractParam::name:
/// INSTANTIATE_TEST_SUITE_P(X, BackendContract, values, ContractParamName{}).
struct ContractParamName {
  std::string operator()(const ::testing::TestParamInfo<ContractParam>& info) const {
    std::string name = info.param.name.empty() ? "param" + std::to_string(info.index) : info.param.name;
    for (auto& c : name) {
      if (std::isalnum(static_cast<unsigned char>(c)) == 0) c = '_';
    }
    return name;
  }
};

}  // namespace corma::contract
