#include "raw_ucx.hpp"

#include <chrono>
#include <stdexcept>

namespace corma::bench {

namespace {

void check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) throw std::runtime_error(std::string(what) + ": " + ucs_status_string(status));
}

}  // namespace

RawWorker::RawWorker(const std::string& tls) {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucp_config_modify(config, "TLS", tls.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;  // as corma's backend
  const auto init = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(init, "ucp_init");
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  check(ucp_worker_create(context_, &worker_params, &worker_), "ucp_worker_create");
}

RawWorker::~RawWorker() {
  for (auto* ep : endpoints_) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(ep, &param);
    while (request != nullptr && !UCS_PTR_IS_ERR(request) && ucp_request_check_status(request) == UCS_INPROGRESS) {
      ucp_worker_progress(worker_);
    }
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) ucp_request_free(request);
  }
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

std::vector<std::byte> RawWorker::address() const {
  ucp_address_t* address = nullptr;
  std::size_t len = 0;
  check(ucp_worker_get_address(worker_, &address, &len), "ucp_worker_get_address");
  const auto* bytes = reinterpret_cast<const std::byte*>(address);
  std::vector<std::byte> copy(bytes, bytes + len);
  ucp_worker_release_address(worker_, address);
  return copy;
}

ucp_ep_h RawWorker::connect(const std::vector<std::byte>& address, bool peer_error_handling) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ucp_ep_h ep = nullptr;
  check(ucp_ep_create(worker_, &params, &ep), "ucp_ep_create");
  endpoints_.push_back(ep);
  return ep;
}

void RawWorker::progress_until_idle() {
  while (ucp_worker_progress(worker_) != 0) {
  }
}

RawProgressThread::RawProgressThread(RawWorker& worker)
    : thread_([this, &worker] {
        while (!stop_.load(std::memory_order_relaxed)) ucp_worker_progress(worker.worker());
      }) {}

RawProgressThread::~RawProgressThread() {
  stop_ = true;
  thread_.join();
}

RawRegion::RawRegion(RawWorker& w, void* address, std::size_t length) : worker(w) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = address;
  params.length = length;
  check(ucp_mem_map(worker.context(), &params, &memh), "ucp_mem_map");
  void* key = nullptr;
  std::size_t key_size = 0;
  check(ucp_rkey_pack(worker.context(), memh, &key, &key_size), "ucp_rkey_pack");
  const auto* bytes = static_cast<const std::byte*>(key);
  packed_key.assign(bytes, bytes + key_size);
  ucp_rkey_buffer_release(key);
}

RawRegion::~RawRegion() { ucp_mem_unmap(worker.context(), memh); }

namespace {

struct Slot {
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point started;
};

void on_done(void* request, ucs_status_t, void* user_data) {
  static_cast<Slot*>(user_data)->done.store(true, std::memory_order_relaxed);
  ucp_request_free(request);
}

}  // namespace

double raw_get_loop(RawWorker& worker, ucp_ep_h ep, std::byte* local, std::uint64_t remote, ucp_rkey_h rkey,
                    std::size_t size, std::size_t window, std::size_t total_ops, std::vector<double>* latencies_us) {
  using clock = std::chrono::steady_clock;
  std::vector<Slot> slots(window);
  std::vector<bool> busy(window, false);
  std::size_t issued = 0, completed = 0;
  const auto start = clock::now();
  auto issue = [&](std::size_t i) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &on_done;
    param.user_data = &slots[i];
    slots[i].done = false;
    slots[i].started = clock::now();
    void* request = ucp_get_nbx(ep, local, size, remote, rkey, &param);
    if (UCS_PTR_IS_ERR(request)) throw std::runtime_error("ucp_get_nbx failed");
    if (request == nullptr) slots[i].done = true;
    busy[i] = true;
    ++issued;
  };
  for (std::size_t i = 0; i < window && issued < total_ops; ++i) issue(i);
  while (completed < total_ops) {
    ucp_worker_progress(worker.worker());
    for (std::size_t i = 0; i < window; ++i) {
      if (!busy[i] || !slots[i].done.load(std::memory_order_relaxed)) continue;
      busy[i] = false;
      ++completed;
      if (latencies_us != nullptr) {
        latencies_us->push_back(std::chrono::duration<double, std::micro>(clock::now() - slots[i].started).count());
      }
      if (issued < total_ops) issue(i);
    }
  }
  return std::chrono::duration<double>(clock::now() - start).count();
}

namespace {

void count_done(void* request, ucs_status_t, void* user_data) {
  ++*static_cast<std::size_t*>(user_data);
  ucp_request_free(request);
}

/// Request parameters whose completion adds one to `*done`.
ucp_request_param_t counting_into(std::size_t* done) {
  ucp_request_param_t counted{};
  counted.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  counted.cb.send = &count_done;
  counted.user_data = done;
  return counted;
}

}  // namespace

double raw_batches(RawWorker& worker, ucp_ep_h ep, std::byte* local, std::uint64_t remote, ucp_rkey_h rkey,
                   std::size_t size, std::size_t batch, std::size_t batches, bool puts) {
  using clock = std::chrono::steady_clock;
  std::size_t done = 0;
  const ucp_request_param_t counted = counting_into(&done);
  ucp_request_param_t uncounted{};
  // Gets are counted one by one; puts are completed by one counted flush.
  const std::size_t expected = puts ? 1 : batch;
  const auto start = clock::now();
  for (std::size_t round = 0; round < batches; ++round) {
    done = 0;
    for (std::size_t i = 0; i < batch; ++i) {
      void* request = puts ? ucp_put_nbx(ep, local + i * size, size, remote + i * size, rkey, &uncounted)
                           : ucp_get_nbx(ep, local + i * size, size, remote + i * size, rkey, &counted);
      if (UCS_PTR_IS_ERR(request)) throw std::runtime_error(puts ? "ucp_put_nbx failed" : "ucp_get_nbx failed");
      if (request == nullptr) {
        if (!puts) ++done;
      } else if (puts) {
        ucp_request_free(request);  // UCX releases it when it completes
      }
    }
    if (puts) {
      void* flush = ucp_ep_flush_nbx(ep, &counted);
      if (UCS_PTR_IS_ERR(flush)) throw std::runtime_error("ucp_ep_flush_nbx failed");
      if (flush == nullptr) done = 1;
    }
    while (done < expected) ucp_worker_progress(worker.worker());
  }
  return std::chrono::duration<double>(clock::now() - start).count();
}

double raw_strided(RawWorker& worker, ucp_ep_h ep, std::byte* local, std::uint64_t remote, ucp_rkey_h rkey,
                   const StridedShape& shape, std::size_t rounds, bool puts) {
  std::size_t done = 0;
  const ucp_request_param_t counted = counting_into(&done);
  ucp_request_param_t bare{};
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t round = 0; round < rounds; ++round) {
    done = 0;
    for (std::size_t i = 0; i < shape.blocks; ++i) {
      std::byte* here = local + i * shape.local_stride;
      const std::uint64_t there = remote + i * shape.remote_stride;
      void* request = puts ? ucp_put_nbx(ep, here, shape.size, there, rkey, &bare)
                           : ucp_get_nbx(ep, here, shape.size, there, rkey, &bare);
      if (UCS_PTR_IS_ERR(request)) throw std::runtime_error(puts ? "ucp_put_nbx failed" : "ucp_get_nbx failed");
      if (request != nullptr) ucp_request_free(request);  // UCX releases it when it completes
    }
    void* flush = ucp_ep_flush_nbx(ep, &counted);
    if (UCS_PTR_IS_ERR(flush)) throw std::runtime_error("ucp_ep_flush_nbx failed");
    if (flush == nullptr) done = 1;
    while (done < 1) ucp_worker_progress(worker.worker());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double raw_map_unmap_us(RawWorker& worker, void* address, std::size_t size, int ops) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = address;
    params.length = size;
    ucp_mem_h memh = nullptr;
    if (ucp_mem_map(worker.context(), &params, &memh) != UCS_OK) throw std::runtime_error("ucp_mem_map");
    ucp_mem_unmap(worker.context(), memh);
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / ops;
}

}  // namespace corma::bench
