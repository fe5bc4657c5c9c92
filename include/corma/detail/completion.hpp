// Holding a type-erased completion handler across threads and handing the
// result to the handler's own executor. Every corma operation that completes
// later, on another thread, goes through this one class.
#pragma once

#include <boost/asio/any_completion_executor.hpp>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <corma/detail/unique_function.hpp>

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace corma::detail {

namespace asio = boost::asio;

/// Runs a rollback unless it was disarmed: rides along with a completion so
/// that a result which never reaches its handler (the handler's io_context was
/// destroyed first) is undone instead of leaked.
class RollbackUnlessDelivered {
 public:
  RollbackUnlessDelivered() = default;
  explicit RollbackUnlessDelivered(UniqueFunction rollback) : rollback_(std::move(rollback)) {}
  RollbackUnlessDelivered(RollbackUnlessDelivered&& other) noexcept
      : rollback_(std::move(other.rollback_)) {}
  RollbackUnlessDelivered& operator=(RollbackUnlessDelivered&&) = delete;
  RollbackUnlessDelivered(const RollbackUnlessDelivered&) = delete;
  ~RollbackUnlessDelivered() {
    if (rollback_) rollback_();
  }
  void disarm() noexcept { rollback_ = nullptr; }

 private:
  UniqueFunction rollback_;
};

/// Which cancellation types an operation honours. Asio's `terminal` lets an
/// operation's effects go on after its caller is answered `cancelled`;
/// `partial` and `total` promise a known or an unchanged state. A transfer
/// (its bytes may still land) and an unmap (it proceeds once submitted)
/// honour `terminal_only` and run to their real result on the others; a map,
/// whose cancellation leaves nothing behind, honours `any_cancellation`.
inline constexpr asio::cancellation_type terminal_only = asio::cancellation_type::terminal;
inline constexpr asio::cancellation_type any_cancellation =
    asio::cancellation_type::terminal | asio::cancellation_type::partial | asio::cancellation_type::total;

/// Hand-offs gathered on one thread while a scope of this type is open (a
/// backend's progress turn) and made when it closes: completions bound for
/// the same executor go over in one dispatch, paying one queue insertion and
/// at most one wake-up of the caller's thread for all of them. Completions
/// whose executor runs on this thread run inline, in order, when it closes.
class BulkHandoff {
 public:
  BulkHandoff() : outer_(std::exchange(current(), this)) {}
  BulkHandoff(const BulkHandoff&) = delete;
  BulkHandoff& operator=(const BulkHandoff&) = delete;
  ~BulkHandoff() {
    flush();
    current() = outer_;
  }

  /// The scope open on this thread, if any.
  static BulkHandoff*& current() noexcept {
    thread_local BulkHandoff* scope = nullptr;
    return scope;
  }

  /// Queues `deliver` for `work`'s executor, after whatever this scope
  /// already holds for it.
  void add(asio::any_completion_executor work, UniqueFunction deliver) {
    for (auto& group : groups_) {
      if (group.work == work) {
        group.delivers.push_back(std::move(deliver));
        return;
      }
    }
    groups_.push_back(Group{std::move(work), {}});
    groups_.back().delivers.push_back(std::move(deliver));
  }

  /// Hands over everything gathered so far, one dispatch per executor.
  void flush() {
    while (!groups_.empty()) {
      auto groups = std::move(groups_);
      groups_.clear();
      for (auto& group : groups) {
        asio::dispatch(group.work, [delivers = std::move(group.delivers)]() mutable {
          for (auto& deliver : delivers) deliver();
        });
      }
    }
  }

 private:
  struct Group {
    asio::any_completion_executor work;  // keeps the caller's context busy until the delivery
    std::vector<UniqueFunction> delivers;
  };
  std::vector<Group> groups_;
  BulkHandoff* outer_;
};

template <class Signature>
class Completion;

/// A pending completion: the handler plus outstanding work on its executor,
/// so the caller's io_context keeps running while the operation is away on
/// another thread.
template <class... Args>
class Completion<void(Args...)> {
 public:
  using Handler = asio::any_completion_handler<void(Args...)>;

  Completion() = default;
  explicit Completion(Handler handler)
      : slot_(asio::get_associated_cancellation_slot(handler)),
        work_(asio::prefer(asio::get_associated_executor(handler),
                           asio::execution::outstanding_work.tracked)),
        handler_(std::move(handler)) {}

  Completion(Completion&&) noexcept = default;
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  // Boost 1.81's any_completion_handler move assignment recurses forever (it
  // copies from an lvalue through its converting constructor): swap instead.
  Completion& operator=(Completion&& other) noexcept {
    Handler taken(std::move(other.handler_));
    handler_.swap(taken);
    slot_ = other.slot_;
    work_ = std::move(other.work_);
    return *this;
  }
  ~Completion() = default;

  [[nodiscard]] explicit operator bool() const noexcept { return static_cast<bool>(handler_); }

  /// The caller's cancellation slot (may be unconnected). Operations assign
  /// a handler holding only weak references and never clear it from their own
  /// thread: Asio slots are not thread-safe, and a late signal after
  /// completion is a harmless no-op.
  [[nodiscard]] asio::cancellation_slot cancellation_slot() const noexcept { return slot_; }

  /// Assigns `on_cancel()` to the caller's slot, if connected, called only
  /// for the signals of a type in `honoured`; call it on the caller's thread,
  /// at initiation.
  template <class OnCancel>
  void on_cancellation(asio::cancellation_type honoured, OnCancel on_cancel) const {
    if (!slot_.is_connected()) return;
    asio::cancellation_slot slot = slot_;
    slot.assign([honoured, on_cancel = std::move(on_cancel)](asio::cancellation_type type) mutable {
      if ((type & honoured) == asio::cancellation_type::none) return;  // not honoured: runs on
      on_cancel();
    });
  }

  /// Completes on the handler's executor; runs inline only when the current
  /// thread already runs in that executor. Inside a BulkHandoff scope the
  /// hand-off waits for the scope's end, with the others bound for the same
  /// executor. Never call it from the initiating function itself: use post()
  /// there.
  void dispatch(Args... args) {
    if (auto* bulk = BulkHandoff::current()) {
      auto work = std::move(work_);
      bulk->add(std::move(work), [handler = std::move(handler_), args = std::make_tuple(std::move(args)...)]() mutable {
        std::apply(std::move(handler), std::move(args));
      });
      return;
    }
    hand_off<false>(RollbackUnlessDelivered{}, {}, std::move(args)...);
  }

  /// Completes on the handler's executor, never inline: for answers given
  /// from the initiating function. Posted to the handler's own executor
  /// where it can be posted to (an io_context's, a strand, any_io_executor:
  /// what coroutines and bound handlers carry); otherwise (a handler with
  /// no executor of its own, or one type-erased beyond reach) through `via`,
  /// a thread-free executor the operation knows (its backend's progress
  /// executor), from which it is dispatched. With neither (an operation on
  /// an empty object), a handler with no executor of its own runs here,
  /// before the initiating function returns: there is nothing to post it
  /// to, and corma starts no thread for it (Asio's default for such a
  /// handler is a hidden pool of its own).
  void post(const asio::any_io_executor& via, Args... args) {
    hand_off<true>(RollbackUnlessDelivered{}, via, std::move(args)...);
  }
  /// post() for answers where no backend is at hand (an empty guard).
  void post(Args... args) { post(asio::any_io_executor{}, std::move(args)...); }

  /// Like dispatch(), but `rollback` runs (on whatever thread destroys the
  /// undelivered handler) if the handler is destroyed without being invoked.
  void dispatch_or_rollback(UniqueFunction rollback, Args... args) {
    hand_off<false>(RollbackUnlessDelivered{std::move(rollback)}, {}, std::move(args)...);
  }

 private:
  /// The handler's own executor, if it is one that can be posted to.
  static std::optional<asio::any_io_executor> postable(const asio::any_completion_executor& work) {
    using io_tracked = decltype(asio::prefer(std::declval<asio::io_context::executor_type>(),
                                             asio::execution::outstanding_work.tracked));
    if (auto* any = work.template target<asio::any_io_executor>()) return *any;
    if (auto* io = work.template target<io_tracked>()) return asio::any_io_executor(*io);
    if (auto* strand = work.template target<asio::strand<asio::any_io_executor>>()) return asio::any_io_executor(*strand);
    if (auto* strand = work.template target<asio::strand<io_tracked>>()) return asio::any_io_executor(*strand);
    return std::nullopt;
  }

  template <bool AlwaysPost>
  void hand_off(RollbackUnlessDelivered rollback, const asio::any_io_executor& via, Args... args) {
    auto work = std::move(work_);
    auto deliver = [handler = std::move(handler_), rollback = std::move(rollback),
                    args = std::make_tuple(std::move(args)...)]() mutable {
      rollback.disarm();
      std::apply(std::move(handler), std::move(args));
    };
    if constexpr (AlwaysPost) {
      if (auto own = postable(work)) {
        asio::post(*own, std::move(deliver));
      } else if (via) {
        // From `via`'s thread the dispatch cannot run on the caller's stack.
        asio::post(via, [work = std::move(work), deliver = std::move(deliver)]() mutable {
          asio::dispatch(work, std::move(deliver));
        });
      } else {
        asio::dispatch(work, std::move(deliver));
      }
    } else {
      asio::dispatch(work, std::move(deliver));
    }
  }

  asio::cancellation_slot slot_;
  asio::any_completion_executor work_;
  Handler handler_;
};

}  // namespace corma::detail
