// The transfer half of a provider-backed engine, over the provider's own
// transfer op type: the provider's hooks receive its ops as they are (no
// downcasts), ops come from a pool that recycles their memory across
// threads (backend_kit/op_pool.hpp), and admitted transfers live in a flat
// slot table. Gets, puts and batches are initiated here for every provider,
// so their rules live in one place.
#pragma once

#include "backend_kit/engine_core.hpp"
#include "backend_kit/op_pool.hpp"
#include "backend_kit/transfer_table.hpp"

#include <algorithm>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace corma::backend_kit {

template <class Op>
class TransferEngine : public EngineCore {
  static_assert(std::is_base_of_v<TransferOp, Op>, "a provider's transfer op derives from TransferOp");

 public:
  using EngineCore::EngineCore;

  // ---- any thread ----

  void initiate_transfer(bool is_put, TransferRequest request, RdmaBackend::Handler<void> h) final {
    auto op = make_op();
    op->completion = Completion<void(Result<void>)>(std::move(h));
    op->kind = is_put ? TransferKind::put : TransferKind::get;
    op->request = std::move(request);
    // A cancelled transfer's bytes may still land.
    watch_cancellation(op, detail::terminal_only, [this](const std::shared_ptr<Op>& o) { cancel_transfer(o); });
    submit([this, op] { run_transfer(op); },
           [this, op](Error e) { op->completion.post(progress_executor(), std::move(e)); });
  }

  void initiate_atomic(AtomicRequest request, RdmaBackend::Handler<std::uint64_t> h) final {
    auto op = make_op();
    op->value_completion = Completion<void(Result<std::uint64_t>)>(std::move(h));
    op->kind = TransferKind::atomic;
    op->request.peer = request.peer;
    op->atomic = std::move(request);
    // Like a transfer's: the atomic may still apply.
    watch_cancellation(op, op->value_completion, detail::terminal_only,
                       [this](const std::shared_ptr<Op>& o) { cancel_transfer(o); });
    submit([this, op] { run_atomic(op); },
           [this, op](Error e) { op->value_completion.post(progress_executor(), std::move(e)); });
  }

  void initiate_flush(PeerId peer, RdmaBackend::Handler<void> h) final {
    auto op = make_op();
    op->completion = Completion<void(Result<void>)>(std::move(h));
    op->kind = TransferKind::flush;
    op->request.peer = peer;
    watch_cancellation(op, detail::terminal_only, [this](const std::shared_ptr<Op>& o) { cancel_transfer(o); });
    submit([this, op] { run_flush(op); },
           [this, op](Error e) { op->completion.post(progress_executor(), std::move(e)); });
  }

  void initiate_notify(PeerId peer, std::uint64_t tag, RdmaBackend::Handler<void> h) final {
    auto op = make_op();
    op->completion = Completion<void(Result<void>)>(std::move(h));
    op->kind = TransferKind::notify;
    op->request.peer = peer;
    op->tag = tag;
    // Like a transfer's: the notification may still arrive.
    watch_cancellation(op, detail::terminal_only, [this](const std::shared_ptr<Op>& o) { cancel_transfer(o); });
    submit([this, op] { run_notify(op); },
           [this, op](Error e) { op->completion.post(progress_executor(), std::move(e)); });
  }

  void initiate_batch(bool is_put, TransferBatch batch, std::optional<BatchNotification> notification,
                      RdmaBackend::Handler<BatchOutcome> h) final {
    const std::size_t transfers = batch.size();
    auto op = std::allocate_shared<BatchOp<Op>>(OpAllocator<BatchOp<Op>>(),
                                                detail::BatchTally::BatchCompletion(std::move(h)),
                                                transfers + (notification ? 1 : 0));
    if (auto fits = validate_batch_size(transfers); !fits) {
      return op->tally.refuse(progress_executor(), std::move(fits).error());
    }
    if (batch.empty() && !notification) return op->tally.answer_empty(progress_executor());
    const std::shared_ptr<detail::BatchTally> tally(op, &op->tally);
    std::vector<std::shared_ptr<Op>> elements;
    const auto add = [&](std::shared_ptr<Op> element) {
      element->batch = tally;
      element->batch_index = elements.size();
      op->elements.push_back(element);
      elements.push_back(std::move(element));
    };
    const auto kind = is_put ? TransferKind::put : TransferKind::get;
    if (runs_whole_batches()) {
      auto runs = runs_by_peer(kind, std::move(batch));
      elements.reserve(runs.size() + 1);
      op->elements.reserve(runs.size() + 1);
      for (auto& run : runs) add(std::move(run));
    } else {
      elements.reserve(transfers + 1);
      op->elements.reserve(transfers + 1);
      for (auto& request : batch) {
        auto element = make_op();
        element->kind = kind;
        element->request = std::move(request);
        add(std::move(element));
      }
    }
    if (notification) {
      auto element = make_op();
      element->kind = TransferKind::notify;
      element->request.peer = notification->peer;
      element->tag = notification->tag;
      add(std::move(element));
      elements.back()->batch_index = transfers;  // after every transfer, however they run
    }
    // Like a single transfer's: the elements' bytes may still land.
    watch_cancellation(op, detail::terminal_only, [this](const std::shared_ptr<BatchOp<Op>>& o) {
      for (auto& element : o->elements) {
        if (auto running = element.lock()) cancel_transfer(running);
      }
    });
    submit([this, op, elements = std::move(elements)] { run_batch(*op, elements); },
           [this, op](Error e) { op->tally.refuse(progress_executor(), std::move(e)); });
  }

 protected:
  // ---- provider hooks (progress thread) ----

  /// Admits and posts the transfer, or answers it.
  virtual void run_transfer(const std::shared_ptr<Op>& op) = 0;
  /// Admits and posts the atomic (`op->atomic`), or answers it; the
  /// provider sets `op->fetched` before answering success. A provider
  /// without atomics keeps this default.
  virtual void run_atomic(const std::shared_ptr<Op>& op) {
    answer(*op, fail(errc::not_configured, settings.name + " backend has no atomics"));
  }
  /// Completes once every put to `op->request.peer` issued before is
  /// complete at the target.
  virtual void run_flush(const std::shared_ptr<Op>& op) = 0;
  /// Sends `op->tag` to `op->request.peer` once every put to it issued
  /// before is complete there; answered once the target queued it (or
  /// refused it: deliver_notification's answer on that side).
  virtual void run_notify(const std::shared_ptr<Op>& op) = 0;
  /// Whether the provider runs a batch's elements to one peer as one
  /// transfer (run_whole_batch) rather than one by one (run_transfer).
  [[nodiscard]] virtual bool runs_whole_batches() const noexcept { return false; }
  /// Admits every element of `op->run` (refusing each bad one by index with
  /// refuse_element, before anything is posted), pins and tracks the rest
  /// as one transfer (track_run), posts them and answers `op` once they all
  /// ended; or answers `op` whole when none of it may run.
  virtual void run_whole_batch(const std::shared_ptr<Op>& op) {
    answer(*op, fail(errc::not_configured, settings.name + " backend runs batches element by element"));
  }
  /// The provider cannot stop a posted transfer: the caller is released, the
  /// region stays pinned until the transfer really ends.
  virtual void cancel_transfer(const std::shared_ptr<Op>& op) {
    if (op->id != 0 && transfers_.find(op->id) != nullptr) answer(*op, fail(errc::cancelled, "transfer cancelled"));
  }
  /// The transfer passed its deadline (already answered `timeout`).
  virtual void on_transfer_deadline(Op& op) = 0;
  /// Shutdown: a transfer the provider never finished is about to be answered.
  virtual void forget_transfer(Op& /*op*/) {}

  // ---- the table (progress thread) ----

  /// Records an admitted transfer (id, deadline, pinned region).
  void track(const std::shared_ptr<Op>& op, Region& region) {
    op->id = transfers_.insert(op);
    op->deadline = deadline_from_now();
    note_transfer_started(&region);
  }
  /// Records an admitted atomic or flush, which pins no region of ours.
  void track(const std::shared_ptr<Op>& op) {
    op->id = transfers_.insert(op);
    op->deadline = deadline_from_now();
    note_transfer_started(nullptr);
  }
  /// Records an admitted run (run_whole_batch): one table entry, its
  /// deadline, each distinct local region in `op->run_pins` pinned once.
  void track_run(const std::shared_ptr<Op>& op) {
    auto& pins = op->run_pins;
    std::sort(pins.begin(), pins.end());
    pins.erase(std::unique(pins.begin(), pins.end()), pins.end());
    for (const auto region : pins) pin(region);
    track(op);
  }
  /// Element `i` of a run never reaches the provider: it is answered now,
  /// with `error`, by its index in the batch.
  static void refuse_element(Op& op, std::size_t i, Error error) {
    --op.run_reports;
    op.batch->element_done(op.run_index(i), std::move(error));
  }
  /// The transfer ended for the provider: the regions it pinned are let go.
  void unpin_transfer(const Op& op) {
    if (!op.whole_batch) return unpin(op.request.local);
    for (const auto region : op.run_pins) unpin(region);
  }
  /// Removes a transfer from the table; null when unknown. Still pinned.
  std::shared_ptr<Op> untrack(std::uint64_t id) {
    auto op = transfers_.take(id);
    if (op) note_transfer_left();
    return op;
  }
  [[nodiscard]] Op* find_transfer(std::uint64_t id) const { return transfers_.find(id); }
  [[nodiscard]] std::shared_ptr<Op> share_transfer(std::uint64_t id) const { return transfers_.share(id); }
  [[nodiscard]] bool has_transfers() const noexcept { return !transfers_.empty(); }
  /// The ids of the transfers `pred(op)` holds for.
  template <class Pred>
  [[nodiscard]] std::vector<std::uint64_t> transfers_where(Pred&& pred) const {
    return transfers_.ids_where(std::forward<Pred>(pred));
  }

 private:
  static std::shared_ptr<Op> make_op() { return std::allocate_shared<Op>(OpAllocator<Op>()); }

  static std::shared_ptr<Op> make_run(TransferKind kind, PeerId peer) {
    auto run = make_op();
    run->kind = kind;
    run->whole_batch = true;
    run->request.peer = peer;
    return run;
  }

  /// A batch's elements as one run per peer, in the order each peer first
  /// appears. A batch to one peer (the usual one) moves whole into its run.
  static std::vector<std::shared_ptr<Op>> runs_by_peer(TransferKind kind, TransferBatch batch) {
    std::vector<std::shared_ptr<Op>> runs;
    if (batch.empty()) return runs;  // a notification alone
    const PeerId first = batch.front().peer;
    const bool one_peer = std::all_of(batch.begin(), batch.end(), [&](const auto& r) { return r.peer == first; });
    if (one_peer) {
      runs.push_back(make_run(kind, first));
      runs.back()->run = std::move(batch);
    } else {
      std::unordered_map<std::uint64_t, std::size_t> run_of_peer;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const PeerId peer = batch[i].peer;
        auto [at, added] = run_of_peer.try_emplace(static_cast<std::uint64_t>(peer), runs.size());
        if (added) runs.push_back(make_run(kind, peer));
        auto& run = *runs[at->second];
        run.run.push_back(std::move(batch[i]));
        run.run_indices.push_back(static_cast<std::uint32_t>(i));
      }
    }
    for (auto& run : runs) run->run_reports = run->run.size();
    return runs;
  }

  /// Runs each element as a single transfer (a cancelled batch's elements
  /// answer `cancelled` before they run). A trailing notification runs
  /// after every put, unless a put to its peer was refused before it was
  /// issued: then it fails with that put's error, unsent.
  void run_batch(const BatchOp<Op>& op, const std::vector<std::shared_ptr<Op>>& elements) {
    const bool cancelled = op.cancelled.load(std::memory_order_acquire);
    for (const auto& element : elements) {
      if (cancelled) element->cancelled.store(true, std::memory_order_release);
      if (element->whole_batch) {
        run_whole_batch(element);
        continue;
      }
      if (element->kind != TransferKind::notify) {
        run_transfer(element);
        continue;
      }
      if (auto refused = refused_put_to(op.tally, elements, element->request.peer)) {
        answer(*element, Error{refused->code, "notification not sent: " + refused->detail});
        continue;
      }
      run_notify(element);
    }
  }

  /// The first put of a batch to `peer` already answered with an error:
  /// refused before it was issued (this runs on the thread elements report on).
  static std::optional<Error> refused_put_to(const detail::BatchTally& tally,
                                             const std::vector<std::shared_ptr<Op>>& elements, PeerId peer) {
    for (const auto& element : elements) {
      if (element->kind != TransferKind::put || element->request.peer != peer) continue;
      if (!element->whole_batch) {
        if (!element->answered) continue;
        if (const auto& error = tally.error_of(element->batch_index)) return *error;
        continue;
      }
      // A run's elements refused by index (or all of them, answered whole).
      for (std::size_t i = 0; i < element->run.size(); ++i) {
        if (const auto& error = tally.error_of(element->run_index(i))) return *error;
      }
    }
    return std::nullopt;
  }

  [[nodiscard]] bool transfers_idle() const final { return transfers_.empty(); }

  void fail_unfinished_transfers() final {
    transfers_.for_each([this](std::uint64_t, const std::shared_ptr<Op>& op) {
      forget_transfer(*op);
      answer(*op, shut_down_error());
    });
    note_no_transfers();
  }

  void drop_transfers() final { transfers_.clear(); }

  bool answer_late_transfers(std::chrono::steady_clock::time_point now) final {
    std::vector<std::shared_ptr<Op>> late;
    transfers_.for_each([&](std::uint64_t, const std::shared_ptr<Op>& op) {
      if (!op->answered && op->deadline <= now) late.push_back(op);
    });
    for (auto& op : late) {
      answer(*op, fail(errc::timeout, "transfer passed its deadline; the peer is now treated as broken"));
      on_transfer_deadline(*op);
    }
    return !transfers_.empty();
  }

  TransferTable<Op> transfers_;
};

}  // namespace corma::backend_kit
