// A peer's remote key, unpacked for one endpoint, destroyed when its last
// holder lets go. The peer's key cache, an imported key id and every
// transfer admitted with the key each hold it, so a key released, evicted
// or forgotten with its peer lives exactly as long as the transfers that
// still use it, with no counts or ownership flags kept beside it.
#pragma once

#include <corma/backend.hpp>

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>

namespace corma::ucx {

class RemoteKey {
 public:
  /// Takes `rkey` (from ucp_ep_rkey_unpack), which reaches [addr, addr + len)
  /// registered with `access`.
  RemoteKey(ucp_rkey_h rkey, std::uint64_t addr, std::uint64_t len, Access access) noexcept
      : rkey_(rkey), addr_(addr), len_(len), access_(access) {}
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  /// Runs on the progress thread, before the worker goes (the engine drops
  /// every holder before ucp_worker_destroy).
  ~RemoteKey() { ucp_rkey_destroy(rkey_); }

  [[nodiscard]] ucp_rkey_h handle() const noexcept { return rkey_; }
  [[nodiscard]] std::uint64_t addr() const noexcept { return addr_; }
  [[nodiscard]] std::uint64_t len() const noexcept { return len_; }
  [[nodiscard]] Access access() const noexcept { return access_; }

 private:
  ucp_rkey_h rkey_;
  std::uint64_t addr_;
  std::uint64_t len_;
  Access access_;
};

using SharedRemoteKey = std::shared_ptr<const RemoteKey>;

}  // namespace corma::ucx
