// The baseline: plain ucp_* calls, no corma in between. A RawWorker owns a
// context and a single-threaded worker; whoever drives it (the benchmark's
// own thread) is its progress thread.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <stdexcept>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace corma::bench {

class RawWorker {
 public:
  explicit RawWorker(const std::string& tls);
  ~RawWorker();
  RawWorker(const RawWorker&) = delete;
  RawWorker& operator=(const RawWorker&) = delete;

  [[nodiscard]] ucp_context_h context() const noexcept { return context_; }
  [[nodiscard]] ucp_worker_h worker() const noexcept { return worker_; }
  [[nodiscard]] std::vector<std::byte> address() const;
  /// An endpoint to another worker (error handling as corma configures it).
  ucp_ep_h connect(const std::vector<std::byte>& address, bool peer_error_handling);
  void progress_until_idle();

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> endpoints_;
};

/// Keeps a worker progressed from its own thread (a get target).
class RawProgressThread {
 public:
  explicit RawProgressThread(RawWorker& worker);
  ~RawProgressThread();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Registered memory on a raw worker, with its packed key.
struct RawRegion {
  RawRegion(RawWorker& worker, void* address, std::size_t length);
  ~RawRegion();
  RawWorker& worker;
  ucp_mem_h memh = nullptr;
  std::vector<std::byte> packed_key;
};

/// The UCX transports raw UCX uses for a corma transport name ("tcp", "shm").
/// Mean microseconds of `ops` ucp_mem_map and ucp_mem_unmap pairs of
/// [address, address + size) on `worker`'s context.
double raw_map_unmap_us(RawWorker& worker, void* address, std::size_t size, int ops);

inline std::string raw_tls(const std::string& transport) { return transport == "tcp" ? "tcp" : "sm"; }

/// An initiator and a target worker connected over `transport`, with
/// `remote_bytes` registered on the target and its key unpacked once.
struct RawPair {
  RawWorker initiator;
  RawWorker target;
  ucp_ep_h ep;
  RawRegion remote;
  ucp_rkey_h rkey = nullptr;

  std::byte* remote_memory;

  RawPair(const std::string& transport, std::byte* remote_bytes, std::size_t size)
      : initiator(raw_tls(transport)),
        target(raw_tls(transport)),
        ep(initiator.connect(target.address(), transport == "tcp")),
        remote(target, remote_bytes, size),
        remote_memory(remote_bytes) {
    if (ucp_ep_rkey_unpack(ep, remote.packed_key.data(), &rkey) != UCS_OK) {
      throw std::runtime_error("raw rkey unpack failed");
    }
  }
  ~RawPair() { ucp_rkey_destroy(rkey); }
};

/// `total_ops` gets of `size` bytes with `window` outstanding, driven from
/// the calling thread; returns the elapsed seconds.
double raw_get_loop(RawWorker& worker, ucp_ep_h ep, std::byte* local, std::uint64_t remote, ucp_rkey_h rkey,
                    std::size_t size, std::size_t window, std::size_t total_ops,
                    std::vector<double>* latencies_us = nullptr);

/// `batches` rounds of `batch` gets (or puts) of `size` bytes (element i
/// at offset i * size on both sides), each round posted at once and waited
/// for whole (puts: posted without callbacks and completed by one endpoint
/// flush); returns the elapsed seconds.
double raw_batches(RawWorker& worker, ucp_ep_h ep, std::byte* local, std::uint64_t remote, ucp_rkey_h rkey,
                   std::size_t size, std::size_t batch, std::size_t batches, bool puts);

/// The shape of a strided transfer: `blocks` blocks of `size` bytes, block i
/// at i * local_stride here and i * remote_stride there.
struct StridedShape {
  std::size_t size = 0;
  std::size_t blocks = 0;
  std::size_t local_stride = 0;
  std::size_t remote_stride = 0;
};

/// `rounds` strided gets (or puts) as a careful hand-written loop would do
/// them: every block posted one by one with no callback, one endpoint flush
/// behind them, waited for; returns the elapsed seconds.
double raw_strided(RawWorker& worker, ucp_ep_h ep, std::byte* local, std::uint64_t remote, ucp_rkey_h rkey,
                   const StridedShape& shape, std::size_t rounds, bool puts);

}  // namespace corma::bench
