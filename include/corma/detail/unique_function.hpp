// A move-only `void()` callable that keeps small callables inside itself.
// std::function must be copyable (so it cannot hold a completion handler)
// and stores anything beyond two pointers on the heap; the commands and
// hand-offs of a backend's hot path (a shared pointer and an engine
// reference; a handler and its result) fit here without an allocation each.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace corma::detail {

class UniqueFunction {
 public:
  /// Callables up to this size (with no over-aligned members, and a
  /// non-throwing move) live inside; others on the heap.
  /// Sized for the largest hand-off of the seam: a type-erased completion
  /// handler with a mapped region's Result (168 bytes on x86-64).
  static constexpr std::size_t inline_size = 176;

  UniqueFunction() noexcept = default;

  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, UniqueFunction>>>
  UniqueFunction(F&& f) {  // NOLINT(google-explicit-constructor): a callable converts, as std::function's does
    using Stored = std::decay_t<F>;
    if constexpr (fits_inline<Stored>()) {
      ::new (static_cast<void*>(storage_)) Stored(std::forward<F>(f));
      ops_ = &inline_ops<Stored>;
    } else {
      *reinterpret_cast<Stored**>(storage_) = new Stored(std::forward<F>(f));
      ops_ = &heap_ops<Stored>;
    }
  }

  UniqueFunction(UniqueFunction&& other) noexcept : ops_(std::exchange(other.ops_, nullptr)) {
    if (ops_ != nullptr) ops_->move(other.storage_, storage_);
  }
  UniqueFunction& operator=(UniqueFunction&& other) noexcept {
    if (this != &other) {
      reset();
      ops_ = std::exchange(other.ops_, nullptr);
      if (ops_ != nullptr) ops_->move(other.storage_, storage_);
    }
    return *this;
  }
  UniqueFunction& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }
  UniqueFunction(const UniqueFunction&) = delete;
  UniqueFunction& operator=(const UniqueFunction&) = delete;
  ~UniqueFunction() { reset(); }

  [[nodiscard]] explicit operator bool() const noexcept { return ops_ != nullptr; }

  void operator()() { ops_->call(storage_); }

 private:
  struct Ops {
    void (*call)(void* storage);
    /// Moves the callable from `from` into the raw `to`, destroying the source.
    void (*move)(void* from, void* to) noexcept;
    void (*destroy)(void* storage) noexcept;
  };

  template <class F>
  static constexpr bool fits_inline() {
    return sizeof(F) <= inline_size && alignof(F) <= alignof(std::max_align_t) &&
           std::is_nothrow_move_constructible_v<F>;
  }

  template <class F>
  static constexpr Ops inline_ops{
      [](void* s) { (*std::launder(static_cast<F*>(s)))(); },
      [](void* from, void* to) noexcept {
        F* source = std::launder(static_cast<F*>(from));
        ::new (to) F(std::move(*source));
        source->~F();
      },
      [](void* s) noexcept { std::launder(static_cast<F*>(s))->~F(); },
  };

  template <class F>
  static constexpr Ops heap_ops{
      [](void* s) { (**static_cast<F**>(s))(); },
      [](void* from, void* to) noexcept { *static_cast<F**>(to) = *static_cast<F**>(from); },
      [](void* s) noexcept { delete *static_cast<F**>(s); },
  };

  void reset() noexcept {
    if (ops_ != nullptr) std::exchange(ops_, nullptr)->destroy(storage_);
  }

  const Ops* ops_ = nullptr;
  alignas(std::max_align_t) std::byte storage_[inline_size];
};

}  // namespace corma::detail
