#include "device.hpp"

#include <cerrno>
#include <cstring>
#include <memory>

namespace corma::verbs {
namespace {

Error not_configured(const std::string& what) { return Error{errc::not_configured, "verbs: " + what}; }

std::string errno_text(int err) { return std::strerror(err); }

bool is_zero(const ibv_gid& gid) {
  for (auto b : gid.raw) {
    if (b != 0) return false;
  }
  return true;
}

/// The first RoCE v2 GID (the routable one), else the first non-zero GID.
Result<int> choose_roce_gid(const IbvApi& api, ibv_context* context, std::uint8_t port, int table_len) {
  int fallback = -1;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid gid{};
    if (api.query_gid(context, port, i, &gid) != 0 || is_zero(gid)) continue;
    if (fallback < 0) fallback = i;
    if (api.query_gid_ex == nullptr) break;
    ibv_gid_entry entry{};
    if (api.query_gid_ex(context, port, static_cast<std::uint32_t>(i), &entry, 0, sizeof entry) == 0 &&
        entry.gid_type == IBV_GID_TYPE_ROCE_V2) {
      return i;
    }
  }
  if (fallback < 0) return not_configured("port " + std::to_string(port) + " has no usable GID");
  return fallback;
}

struct DeviceList {
  const IbvApi& api;
  ibv_device** list = nullptr;
  int count = 0;
  ~DeviceList() {
    if (list != nullptr) api.free_device_list(list);
  }
};

Result<ibv_context*> open_named(const IbvApi& api, const std::string& wanted, std::string& name) {
  DeviceList devices{api};
  errno = 0;
  devices.list = api.get_device_list(&devices.count);
  if (devices.list == nullptr) {
    const int err = errno;
    if (err == ENOSYS) return not_configured("the kernel has no RDMA support (ibv_get_device_list: ENOSYS)");
    return not_configured("ibv_get_device_list failed: " + errno_text(err));
  }
  if (devices.count == 0) return not_configured("no RDMA device found");
  std::string found;
  for (int i = 0; i < devices.count; ++i) {
    const std::string candidate = api.get_device_name(devices.list[i]);
    if (!wanted.empty() && candidate != wanted) {
      found += (found.empty() ? "" : ", ") + candidate;
      continue;
    }
    ibv_context* context = api.open_device(devices.list[i]);
    if (context == nullptr) return not_configured("cannot open " + candidate + ": " + errno_text(errno));
    name = candidate;
    return context;
  }
  return not_configured("no RDMA device named " + wanted + " (found: " + found + ")");
}

}  // namespace

std::uint16_t path_mtu_bytes(const Config& config, const ibv_port_attr& port) {
  if (config.mtu != Mtu::port) return static_cast<std::uint16_t>(config.mtu);
  return static_cast<std::uint16_t>(128U << static_cast<unsigned>(port.active_mtu));
}

ibv_mtu to_ibv_mtu(std::uint16_t bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    default: return IBV_MTU_4096;
  }
}

Result<OpenedDevice> open_device(const IbvApi& api, const Config& config) {
  OpenedDevice device;
  CORMA_TRY(auto* opened, open_named(api, config.device, device.name));
  device.context = own<OwnedContext>(api, opened);  // closed again on any failure below
  const std::string where = device.name + " port " + std::to_string(config.port);
  if (int rc = api.query_device(device.context.get(), &device.device_attr); rc != 0) {
    return not_configured("ibv_query_device on " + device.name + ": " + errno_text(rc));
  }
  if (int rc = api.query_port(device.context.get(), config.port, &device.port_attr); rc != 0) {
    return not_configured("ibv_query_port on " + where + ": " + errno_text(rc));
  }
  if (device.port_attr.state != IBV_PORT_ACTIVE) return not_configured(where + " is not active");
  if (config.gid_index) {
    device.gid_index = *config.gid_index;
    if (api.query_gid(device.context.get(), config.port, device.gid_index, &device.gid) != 0) {
      return not_configured(where + " has no GID at index " + std::to_string(device.gid_index));
    }
  } else if (device.port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
    CORMA_TRY(device.gid_index, choose_roce_gid(api, device.context.get(), config.port, device.port_attr.gid_tbl_len));
    (void)api.query_gid(device.context.get(), config.port, device.gid_index, &device.gid);
  }
  return device;
}

}  // namespace corma::verbs
