// The fault link as the netfault tests use it: made with the relay this
// build produced, and able to start processes inside either namespace
// (killed with the namespaces, also when a test fails).
#pragma once

#include "cli/processes.hpp"
#include "netfault/fault_link.hpp"

#include <string>
#include <vector>

namespace corma::netfault {

using cli::testing::Process;

class NetworkPair : public FaultLink {
 public:
  static std::optional<std::string> unavailable() { return FaultLink::unavailable(); }

  explicit NetworkPair(LinkProfile profile) : FaultLink(profile, CORMA_FAULT_RELAY) {}

  /// Starts `args` inside `side`'s namespace.
  Process start_in(Side side, const std::vector<std::string>& args) const {
    return Process::start(command_in(side, args));
  }
};

}  // namespace corma::netfault
