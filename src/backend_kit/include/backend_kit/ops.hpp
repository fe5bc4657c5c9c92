// The operations a provider-backed engine keeps while they are away on its
// progress thread. Each holds its caller's completion; `answer` delivers it
// exactly once.
#pragma once

#include <corma/backend.hpp>
#include <corma/detail/batch_tally.hpp>
#include <corma/detail/completion.hpp>

#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

namespace corma::backend_kit {

namespace asio = boost::asio;
using detail::Completion;

struct MapOp {
  Completion<void(Result<BackendRegion>)> completion;
  void* ptr = nullptr;
  std::size_t len = 0;
  Access access = Access::local;
  std::atomic<bool> cancelled{false};
  bool answered = false;
  std::uint64_t id = 0;  // while its answer is delayed
  std::optional<RegionId> mapped;
  BackendRegion result;
  std::unique_ptr<asio::steady_timer> timer;
};

struct VoidOp {
  Completion<void(Result<void>)> completion;
  std::atomic<bool> cancelled{false};
  bool answered = false;
};

/// What a transfer op does. Atomics, flushes and notifications name no local region
/// (`request.local` stays 0) but are tracked, timed out, failed with their
/// peer and answered at shutdown like gets and puts.
enum class TransferKind : std::uint8_t { get, put, atomic, flush, notify };

/// "get", "put", "atomic", "flush" or "notify", for messages.
[[nodiscard]] constexpr const char* kind_name(TransferKind kind) noexcept {
  switch (kind) {
    case TransferKind::get: return "get";
    case TransferKind::put: return "put";
    case TransferKind::atomic: return "atomic";
    case TransferKind::flush: return "flush";
    case TransferKind::notify: return "notify";
  }
  return "transfer";
}

/// A get, put, atomic, flush or notification. Providers derive from it to keep their own
/// per-transfer state and run their engine over that type
/// (TransferEngine<Op>). An element of a batch reports to its batch's tally
/// instead of its own completion (which stays empty); an atomic answers
/// through `value_completion` (with `fetched`) instead.
struct TransferOp : VoidOp {
  TransferKind kind = TransferKind::get;
  /// For an atomic or a flush, only `peer` (and an atomic's `key`) is set.
  TransferRequest request;
  AtomicRequest atomic;  ///< kind == atomic
  std::uint64_t fetched = 0;  ///< the word's old value, set by the provider
  std::uint64_t tag = 0;      ///< kind == notify
  Completion<void(Result<std::uint64_t>)> value_completion;
  std::uint64_t id = 0;  // 0 until admitted
  std::chrono::steady_clock::time_point deadline;
  std::shared_ptr<detail::BatchTally> batch;
  std::size_t batch_index = 0;

  // A batch run as one transfer (TransferEngine::runs_whole_batches): its
  // elements, all gets or all puts to `request.peer`, admitted together,
  // tracked as this one op, posted in one loop and answered together.
  bool whole_batch = false;
  TransferBatch run;
  /// Each element's index in the batch; empty when `run` is the whole batch.
  std::vector<std::uint32_t> run_indices;
  /// The elements this op still answers for: those not refused one by one.
  std::size_t run_reports = 0;
  /// The local regions the run pins, each once (`request.local` is unused).
  std::vector<RegionId> run_pins;

  /// Element `i` of the run's index in its batch.
  [[nodiscard]] std::size_t run_index(std::size_t i) const noexcept {
    return run_indices.empty() ? i : run_indices[i];
  }
};

/// A batch of gets or puts: each element is a transfer op of its own,
/// reporting to the one tally. The elements keep their batch alive (their
/// `batch` shares its ownership), not the reverse: a cancellation reaches
/// the elements still running, however long after the batch was submitted.
template <class Op>
struct BatchOp {
  BatchOp(detail::BatchTally::BatchCompletion completion, std::size_t size) : tally(std::move(completion), size) {}

  detail::BatchTally tally;
  std::vector<std::weak_ptr<Op>> elements;
  std::atomic<bool> cancelled{false};
};

/// Where an op's caller connected its cancellation slot.
template <class Op>
const auto& caller_completion(const Op& op) {
  return op.completion;
}
template <class Op>
const auto& caller_completion(const BatchOp<Op>& op) {
  return op.tally.completion();
}

template <class T>
struct ValueOp {
  Completion<void(Result<T>)> completion;
  std::vector<std::byte> blob;
  PeerId peer{};
};

/// Delivers an op's result unless it was already answered.
template <class Op, class T>
void answer(Op& op, T&& result) {
  if (op.answered) return;
  op.answered = true;
  if constexpr (std::is_base_of_v<TransferOp, Op>) {
    if (op.batch && op.whole_batch) {
      return op.batch->run_done(
          op.run.size(), [&op](std::size_t i) { return op.run_index(i); }, op.run_reports,
          Result<void>(std::forward<T>(result)));
    }
    if (op.batch) return op.batch->element_done(op.batch_index, Result<void>(std::forward<T>(result)));
    if (op.kind == TransferKind::atomic) {
      Result<void> outcome(std::forward<T>(result));
      if (!outcome) return op.value_completion.dispatch(std::move(outcome).error());
      return op.value_completion.dispatch(op.fetched);
    }
  }
  op.completion.dispatch(std::forward<T>(result));
}

}  // namespace corma::backend_kit
