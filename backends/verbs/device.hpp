// Opening the configured device and choosing how this side is addressed:
// port attributes, MTU and GID (RoCE v2 auto-selection). Every "cannot run
// here" answer is `not_configured`, saying which piece is missing.
#pragma once

#include "ibv_api.hpp"
#include "owned.hpp"

#include <corma/verbs.hpp>

#include <string>

namespace corma::verbs {

struct OpenedDevice {
  OwnedContext context;
  std::string name;
  ibv_device_attr device_attr{};
  ibv_port_attr port_attr{};
  int gid_index = -1;  ///< -1: no GID (InfiniBand LID routing)
  ibv_gid gid{};
};

/// Opens `config.device` (or the first device), checks the port is active and
/// picks the GID. On failure nothing stays open.
[[nodiscard]] Result<OpenedDevice> open_device(const IbvApi& api, const Config& config);

/// The path MTU in bytes: the configured one, or the port's active MTU.
[[nodiscard]] std::uint16_t path_mtu_bytes(const Config& config, const ibv_port_attr& port);
[[nodiscard]] ibv_mtu to_ibv_mtu(std::uint16_t bytes);

}  // namespace corma::verbs
