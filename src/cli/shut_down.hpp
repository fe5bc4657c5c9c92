// How a command ends its RDMA stack once it is done with it.
#pragma once

#include <corma/registry.hpp>

#include <boost/asio/awaitable.hpp>

#include <memory>
#include <string>

namespace corma::cli {

/// The registry's backend first: it closes its peers, ends (or gives up)
/// their transfers and unmaps what is left, which answers the registry's
/// deregistrations. Then the registry, which finds nothing left to release.
/// Failures are reported on stderr under `command`'s name; true when both
/// shut down cleanly.
boost::asio::awaitable<bool> shut_down(std::shared_ptr<Registry> registry, std::string command);

}  // namespace corma::cli
