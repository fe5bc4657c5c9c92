// One-sided push: atomics and put-then-notify through corma's UCX backend,
// each against the same UCX calls made directly.
#pragma once

#include "scenarios.hpp"

#include <string>

namespace corma::bench {

/// `atomic_latency op=fetch_add size=8B`: one fetch_add at a time, chained
/// from completions on the progress thread; against ucp_atomic_op_nbx
/// waited for one at a time. Target: median <= raw + 1 us.
Measurement atomic_latency(const Options& options, const std::string& transport);

/// `atomic_rate op=fetch_add outstanding=64 inline`: 64 coroutines on the
/// backend's progress executor, each awaiting its own fetch_adds; against
/// raw fetch_adds kept 64 in flight. Target: ratio >= 0.70.
Measurement atomic_rate(const Options& options, const std::string& transport);

/// Where corma's caller runs.
enum class Caller {
  other_thread,       ///< the bench's thread, which sleeps on a future for each answer
  progress_executor,  ///< issues on the initiator's progress executor, receives on the target's
};

/// `put_notify_latency size=64KiB`: a put and a notification behind it,
/// issued from the bench's thread and timed until the target's receiver has
/// the notification; against a raw put, endpoint flush and active message
/// from that thread, timed until the target's handler ran. Target: median
/// <= 1.1 x raw. `size=64KiB inline` (reported): the same, issued and
/// received on the progress executors, so no answer crosses to the bench's
/// thread.
Measurement put_notify_latency(const Options& options, const std::string& transport, Caller caller);

}  // namespace corma::bench
