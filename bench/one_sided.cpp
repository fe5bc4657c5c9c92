#include "one_sided.hpp"

#include "bench_support.hpp"
#include "corma_pair.hpp"
#include "raw_ucx.hpp"

#include <corma/owned_buffer.hpp>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <stdexcept>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t region_size = 1 * MiB;
constexpr unsigned raw_notify_am_id = 7;

AtomicRequest fetch_add(const CormaPair& pair) {
  return AtomicRequest{pair.peer, AtomicOp::fetch_add, pair.remote.effective_addr, 1, 0, pair.key};
}

/// Waits for a raw request to complete by progressing `worker`.
void wait_raw(RawWorker& worker, ucs_status_ptr_t request, const char* what) {
  if (UCS_PTR_IS_ERR(request)) throw std::runtime_error(std::string(what) + " failed");
  if (request == nullptr) return;
  while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker.worker());
  const auto status = ucp_request_check_status(request);
  ucp_request_free(request);
  if (status != UCS_OK) throw std::runtime_error(std::string(what) + " failed");
}

ucs_status_ptr_t raw_fetch_add(RawPair& raw, std::uint64_t* operand, std::uint64_t* reply, ucp_request_param_t& param) {
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  param.datatype = ucp_dt_make_contig(8);
  param.reply_buffer = reply;
  return ucp_atomic_op_nbx(raw.ep, UCP_ATOMIC_OP_ADD, operand, 1, reinterpret_cast<std::uint64_t>(raw.remote_memory),
                           raw.rkey, &param);
}

/// Microseconds of each of `ops` corma fetch_adds, issued one after the
/// other from the completions on the progress thread.
void corma_atomic_latencies(CormaPair& pair, std::size_t ops, std::vector<double>& out) {
  std::promise<void> done;
  std::size_t left = ops;
  std::function<void()> next = [&] {
    const auto started = clock_type::now();
    pair.initiator->async_atomic(fetch_add(pair), [&, started](Result<std::uint64_t> r) {
      if (!r) throw std::runtime_error("corma fetch_add failed: " + r.error().message());
      out.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - started).count());
      if (--left == 0) return done.set_value();
      next();
    });
  };
  next();
  done.get_future().get();
}

void raw_atomic_latencies(RawPair& raw, std::size_t ops, std::vector<double>& out) {
  RawProgressThread target(raw.target);  // serves emulated atomics (tcp)
  std::uint64_t operand = 1;
  std::uint64_t reply = 0;
  for (std::size_t i = 0; i < ops; ++i) {
    const auto started = clock_type::now();
    ucp_request_param_t param{};
    wait_raw(raw.initiator, raw_fetch_add(raw, &operand, &reply, param), "raw fetch_add");
    out.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - started).count());
  }
}

/// Seconds for `ops` fetch_adds by 64 coroutines on the progress executor.
double corma_atomic_rate(CormaPair& pair, std::size_t ops) {
  std::size_t remaining = ops;  // touched only on the progress thread
  auto worker = [&]() -> asio::awaitable<void> {
    while (remaining > 0) {
      --remaining;
      auto r = co_await pair.initiator->async_atomic(fetch_add(pair), asio::use_awaitable);
      if (!r) throw std::runtime_error("corma fetch_add failed: " + r.error().message());
    }
  };
  std::vector<std::future<void>> workers;
  const auto start = clock_type::now();
  for (int c = 0; c < 64; ++c) {
    workers.push_back(asio::co_spawn(pair.initiator->progress_executor(), worker(), asio::use_future));
  }
  for (auto& w : workers) w.get();
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// Seconds for `ops` raw fetch_adds kept 64 in flight.
double raw_atomic_rate(RawPair& raw, std::size_t ops) {
  RawProgressThread target(raw.target);
  struct Slot {
    std::uint64_t operand = 1;
    std::uint64_t reply = 0;
    ucs_status_ptr_t request = nullptr;
  };
  std::vector<Slot> slots(64);
  std::size_t issued = 0;
  std::size_t completed = 0;
  const auto start = clock_type::now();
  while (completed < ops) {
    for (auto& slot : slots) {
      if (slot.request != nullptr && ucp_request_check_status(slot.request) == UCS_INPROGRESS) continue;
      if (slot.request != nullptr) {
        ucp_request_free(slot.request);
        slot.request = nullptr;
        ++completed;
      }
      if (issued == ops) continue;
      ++issued;
      ucp_request_param_t param{};
      slot.request = raw_fetch_add(raw, &slot.operand, &slot.reply, param);
      if (UCS_PTR_IS_ERR(slot.request)) throw std::runtime_error("raw fetch_add failed");
      if (slot.request == nullptr) ++completed;
    }
    ucp_worker_progress(raw.initiator.worker());
  }
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

ucs_status_t count_raw_notification(void* arg, const void*, std::size_t, void*, std::size_t,
                                    const ucp_am_recv_param_t*) {
  static_cast<std::atomic<std::uint64_t>*>(arg)->fetch_add(1, std::memory_order_release);
  return UCS_OK;
}

}  // namespace

Measurement atomic_latency(const Options& options, const std::string& transport) {
  Measurement m{"atomic_latency", transport, "op=fetch_add size=8B", "us", false, {}, {}, {}, true};
  auto remote_memory = OwnedBuffer::allocate(region_size);
  auto local_memory = OwnedBuffer::allocate(region_size);
  CormaPair corma(transport, remote_memory.data(), local_memory.data(), region_size, Access::remote_atomic);
  RawPair raw(transport, remote_memory.data(), region_size);
  const std::size_t ops = static_cast<std::size_t>(2000 * options.bytes_scale) + 100;
  for (int r = 0; r < options.rounds; ++r) {
    corma_atomic_latencies(corma, ops, m.corma);
    raw_atomic_latencies(raw, ops, m.raw);
  }
  m.target = "median <= raw + 1 us";
  m.target_met = m.corma_median() <= m.raw_median() + 1.0;
  return m;
}

Measurement atomic_rate(const Options& options, const std::string& transport) {
  Measurement m{"atomic_rate", transport, "op=fetch_add outstanding=64 inline", "Mops/s", true, {}, {}, {}, true};
  auto remote_memory = OwnedBuffer::allocate(region_size);
  auto local_memory = OwnedBuffer::allocate(region_size);
  CormaPair corma(transport, remote_memory.data(), local_memory.data(), region_size, Access::remote_atomic);
  RawPair raw(transport, remote_memory.data(), region_size);
  const std::size_t ops = static_cast<std::size_t>(20000 * options.bytes_scale) + 640;
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(ops) / corma_atomic_rate(corma, ops) / 1e6);
    m.raw.push_back(static_cast<double>(ops) / raw_atomic_rate(raw, ops) / 1e6);
  }
  m.target = "ratio >= 0.70";
  m.target_met = m.ratio() >= 0.70;
  return m;
}

namespace {

/// `ops` puts of `put` each followed by a notification, issued on the
/// initiator's progress thread and received on the target's: no thread of
/// the bench's is in the path. Each is timed from its issue to its
/// receiver; the next starts once the receiver and the notification's
/// acknowledgement have both been heard. Appends microseconds to `samples`.
void corma_put_notify_inline(CormaPair& corma, const TransferRequest& put, std::size_t ops,
                             std::vector<double>& samples) {
  std::promise<void> finished;
  std::atomic<int> awaited{0};  // of the current put-and-notify: its receipt and its acknowledgement
  clock_type::time_point started;
  std::function<void(std::size_t)> issue;
  const auto heard = [&](std::size_t i) {
    if (awaited.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (i + 1 == ops) return finished.set_value();
    asio::post(corma.initiator->progress_executor(), [&issue, i] { issue(i + 1); });
  };
  issue = [&](std::size_t i) {
    awaited.store(2, std::memory_order_relaxed);
    started = clock_type::now();
    corma.target->async_receive_notification(
        asio::bind_executor(corma.target->progress_executor(), [&, i](Result<Notification> n) {
          if (!n) throw std::runtime_error("corma receive failed: " + n.error().message());
          samples.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - started).count());
          heard(i);
        }));
    corma.initiator->async_put(put, asio::bind_executor(corma.initiator->progress_executor(), [](Result<void> p) {
                                 if (!p) throw std::runtime_error("corma put failed: " + p.error().message());
                               }));
    corma.initiator->async_notify(corma.peer, i,
                                  asio::bind_executor(corma.initiator->progress_executor(), [&, i](Result<void> n) {
                                    if (!n) throw std::runtime_error("corma notify failed: " + n.error().message());
                                    heard(i);
                                  }));
  };
  asio::post(corma.initiator->progress_executor(), [&issue] { issue(0); });
  finished.get_future().get();
}

}  // namespace

Measurement put_notify_latency(const Options& options, const std::string& transport, Caller caller) {
  constexpr std::size_t size = 64 * KiB;
  const bool inline_caller = caller == Caller::progress_executor;
  Measurement m{"put_notify_latency", transport, inline_caller ? "size=64KiB inline" : "size=64KiB", "us", false,
                {}, {}, {}, true};
  auto remote_memory = OwnedBuffer::allocate(region_size);
  auto local_memory = OwnedBuffer::allocate(region_size);
  std::memset(local_memory.data(), 0x5a, region_size);
  CormaPair corma(transport, remote_memory.data(), local_memory.data(), region_size);
  RawPair raw(transport, remote_memory.data(), region_size);
  std::atomic<std::uint64_t> raw_received{0};
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = raw_notify_am_id;
  handler.cb = &count_raw_notification;
  handler.arg = &raw_received;
  if (ucp_worker_set_am_recv_handler(raw.target.worker(), &handler) != UCS_OK) {
    throw std::runtime_error("raw active-message handler");
  }
  const std::size_t ops = static_cast<std::size_t>(500 * options.bytes_scale) + 50;
  auto put = corma.get(0, size);
  for (int r = 0; r < options.rounds; ++r) {
    if (inline_caller) corma_put_notify_inline(corma, put, ops, m.corma);
    // corma: the put and its notification issued at once; the clock stops
    // when the target's receiver has it.
    for (std::size_t i = 0; i < ops && !inline_caller; ++i) {
      std::promise<void> received;
      const auto started = clock_type::now();
      corma.target->async_receive_notification([&](Result<Notification> n) {
        if (!n) throw std::runtime_error("corma receive failed: " + n.error().message());
        received.set_value();
      });
      corma.initiator->async_put(put, [](Result<void> p) {
        if (!p) throw std::runtime_error("corma put failed: " + p.error().message());
      });
      std::promise<void> notified;
      corma.initiator->async_notify(corma.peer, i, [&](Result<void> n) {
        if (!n) throw std::runtime_error("corma notify failed: " + n.error().message());
        notified.set_value();
      });
      received.get_future().get();
      m.corma.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - started).count());
      notified.get_future().get();
    }
    RawProgressThread target(raw.target);
    for (std::size_t i = 0; i < ops; ++i) {
      const auto before = raw_received.load(std::memory_order_acquire);
      const auto started = clock_type::now();
      ucp_request_param_t param{};
      ucs_status_ptr_t put_request = ucp_put_nbx(raw.ep, local_memory.data(), size,
                                                 reinterpret_cast<std::uint64_t>(raw.remote_memory), raw.rkey, &param);
      if (UCS_PTR_IS_ERR(put_request)) throw std::runtime_error("raw put failed");
      if (put_request != nullptr) ucp_request_free(put_request);
      ucp_request_param_t flush_param{};
      wait_raw(raw.initiator, ucp_ep_flush_nbx(raw.ep, &flush_param), "raw flush");
      const std::uint64_t tag = i;
      ucp_request_param_t am_param{};
      wait_raw(raw.initiator, ucp_am_send_nbx(raw.ep, raw_notify_am_id, &tag, sizeof tag, nullptr, 0, &am_param),
               "raw active message");
      while (raw_received.load(std::memory_order_acquire) == before) ucp_worker_progress(raw.initiator.worker());
      m.raw.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - started).count());
    }
  }
  if (inline_caller) {
    m.target = "reported (no hand-off to the caller's thread)";
    m.target_met = true;
  } else {
    m.target = "median <= 1.1 x raw";
    m.target_met = m.corma_median() <= 1.1 * m.raw_median();
  }
  return m;
}

}  // namespace corma::bench
