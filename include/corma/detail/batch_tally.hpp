// Collecting a batch's element results into one answer. A backend runs each
// element as it runs a single transfer and reports its result here instead
// of to a caller; the last report answers the batch, once, on the caller's
// executor: one hand-off per batch, not one per element.
#pragma once

#include <corma/backend.hpp>
#include <corma/detail/completion.hpp>

#include <atomic>
#include <cstddef>
#include <optional>
#include <vector>

namespace corma::detail {

class BatchTally {
 public:
  using BatchCompletion = Completion<void(Result<BatchOutcome>)>;

  BatchTally(BatchCompletion completion, std::size_t size)
      : completion_(std::move(completion)), errors_(size), remaining_(size) {}

  /// The caller's completion, for installing a cancellation handler at
  /// initiation (see Completion::on_cancellation).
  [[nodiscard]] const BatchCompletion& completion() const noexcept { return completion_; }

  /// Element `index` ended with `result`; called once per element, from any
  /// thread. The last call answers the batch.
  void element_done(std::size_t index, Result<void> result) {
    if (!result) errors_[index] = std::move(result).error();
    // acq_rel: the thread that answers sees every other element's error.
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) completion_.dispatch(outcome());
  }

  /// `count` elements that ran as one transfer ended together, element i
  /// at index `index_of(i)` in the batch: the `reports` of them that were
  /// not refused one by one (element_done) end with `result`. On failure
  /// each of those gets its error: every one of them without one yet.
  /// Called on the thread the elements report on.
  template <class IndexOf>
  void run_done(std::size_t count, IndexOf index_of, std::size_t reports, Result<void> result) {
    if (reports == 0) return;
    if (!result) {
      for (std::size_t i = 0; i < count; ++i) {
        auto& error = errors_[index_of(i)];
        if (!error) error = result.error();
      }
    }
    if (remaining_.fetch_sub(reports, std::memory_order_acq_rel) == reports) completion_.dispatch(outcome());
  }

  /// How element `index` failed, if it has: read only on the thread the
  /// elements report on (a backend's progress thread), after the report.
  [[nodiscard]] const std::optional<Error>& error_of(std::size_t index) const noexcept { return errors_[index]; }

  /// The batch never ran (refused whole): answers `error`, never inline
  /// (through `via` where the handler has no executor: Completion::post).
  void refuse(const asio::any_io_executor& via, Error error) { completion_.post(via, std::move(error)); }

  /// For a batch with no elements: answers at once, never inline (this is
  /// called from the initiating function).
  void answer_empty(const asio::any_io_executor& via) { completion_.post(via, BatchOutcome{}); }

 private:
  BatchOutcome outcome() {
    BatchOutcome done;
    done.size = errors_.size();
    for (std::size_t i = 0; i < errors_.size(); ++i) {
      if (errors_[i]) done.failures.push_back(BatchFailure{i, std::move(*errors_[i])});
    }
    return done;
  }

  BatchCompletion completion_;
  std::vector<std::optional<Error>> errors_;  // each written only by its own element
  std::atomic<std::size_t> remaining_;
};

}  // namespace corma::detail
