// Helpers the backend contract's test files share: bounded waits for
// answers (a missing or inline answer is a failure), memory patterns, and
// two connected backends. Only the seam and ContractSubject are used.
#pragma once

#include "contract/contract_subject.hpp"

#include <corma/backend.hpp>
#include <corma/error.hpp>
#include <corma/owned_buffer.hpp>
#include <corma/registry.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace corma::contract {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// How long any one answer may take before the test calls it a hang.
inline constexpr std::chrono::milliseconds answer_limit = 5s;
inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

// ---- answers -------------------------------------------------------------

/// True on a thread while it is inside an initiating function called by the
/// helpers below: a handler that sees it set was invoked inline, which the
/// seam forbids (answers known at once are posted).
inline thread_local bool t_initiating = false;

struct Initiating {
  Initiating() { t_initiating = true; }
  ~Initiating() { t_initiating = false; }
  Initiating(const Initiating&) = delete;
  Initiating& operator=(const Initiating&) = delete;
};

/// A one-shot answer from a plain callback (run wherever the backend
/// completes it), counting invocations. The state is shared with the
/// callback, so a late or second invocation after the test moved on is safe.
template <class T>
class Answer {
 public:
  [[nodiscard]] auto handler() const {
    return [s = shared_](Result<T> r) {
      std::lock_guard lock(s->mutex);
      ++s->calls;
      if (t_initiating) s->inline_call = true;
      if (!s->result) s->result.emplace(std::move(r));
      s->changed.notify_all();
    };
  }

  /// The answer, or nullopt when none came within `limit`.
  [[nodiscard]] std::optional<Result<T>> wait(std::chrono::milliseconds limit = answer_limit) const {
    std::unique_lock lock(shared_->mutex);
    shared_->changed.wait_for(lock, limit, [this] { return shared_->result.has_value(); });
    return shared_->result;
  }
  [[nodiscard]] std::optional<Result<T>> wait_until(Clock::time_point deadline) const {
    std::unique_lock lock(shared_->mutex);
    shared_->changed.wait_until(lock, deadline, [this] { return shared_->result.has_value(); });
    return shared_->result;
  }
  [[nodiscard]] int calls() const {
    std::lock_guard lock(shared_->mutex);
    return shared_->calls;
  }
  [[nodiscard]] bool answered_inline() const {
    std::lock_guard lock(shared_->mutex);
    return shared_->inline_call;
  }

 private:
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    std::optional<Result<T>> result;
    int calls = 0;
    bool inline_call = false;
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

template <class T>
inline std::string describe(const Result<T>& r) {
  return r ? std::string("success") : r.error().message();
}
template <class T>
inline std::string describe(const std::optional<Result<T>>& r) {
  return r ? describe(*r) : std::string("no answer");
}

template <class T>
inline bool failed_with(const Result<T>& r, errc code) {
  return !r && r.error().is(code);
}

/// A failure in the corma category (not a success, not a foreign code).
template <class T>
inline bool is_corma_error(const Result<T>& r) {
  return !r && r.error().code.category() == corma::error_category();
}

/// Initiates through `initiate(handler)` and waits, bounded, for the answer;
/// a missing or inline answer is a test failure.
template <class T, class Initiate>
inline Result<T> call(Initiate initiate, std::chrono::milliseconds limit = answer_limit) {
  Answer<T> answer;
  {
    Initiating scope;
    initiate(answer.handler());
  }
  auto r = answer.wait(limit);
  if (!r) {
    ADD_FAILURE() << "no answer within " << limit.count() << " ms";
    return fail(errc::timeout, "the contract test got no answer");
  }
  EXPECT_FALSE(answer.answered_inline()) << "the handler ran inside the initiating function";
  return std::move(*r);
}

inline Result<BackendRegion> map(RdmaBackend& backend, void* ptr, std::size_t len, Access access) {
  return call<BackendRegion>([&](auto h) { backend.async_map(ptr, len, access, std::move(h)); });
}
inline Result<void> unmap(RdmaBackend& backend, RegionId id) {
  return call<void>([&](auto h) { backend.async_unmap(id, std::move(h)); });
}
inline Result<void> get(RdmaBackend& backend, GetRequest request,
                 std::chrono::milliseconds limit = answer_limit) {
  return call<void>([&](auto h) { backend.async_get(std::move(request), std::move(h)); }, limit);
}
inline Result<void> put(RdmaBackend& backend, PutRequest request) {
  return call<void>([&](auto h) { backend.async_put(std::move(request), std::move(h)); });
}

// ---- waiting on conditions -------------------------------------------------

/// Polls `predicate` (yielding) until it holds or `limit` passes.
template <class Predicate>
inline bool eventually(Predicate predicate, std::chrono::milliseconds limit = answer_limit) {
  const auto deadline = Clock::now() + limit;
  while (!predicate()) {
    if (Clock::now() >= deadline) return predicate();
    std::this_thread::yield();
  }
  return true;
}

/// Runs `io` on this thread until `predicate` holds or `limit` passes.
template <class Predicate>
inline bool run_until(asio::io_context& io, Predicate predicate, std::chrono::milliseconds limit = answer_limit) {
  const auto deadline = Clock::now() + limit;
  while (!predicate()) {
    if (Clock::now() >= deadline) return false;
    io.restart();
    io.run_one_for(10ms);
  }
  return true;
}

/// Runs `io` until no work is left on it: every backend has let go of its
/// handlers (a second answer, if a backend sent one, has run by then).
inline void drain(asio::io_context& io) {
  io.restart();
  io.run_for(answer_limit);
}

/// Holds the backend's progress thread inside a plain-callback completion
/// until release() (or destruction), so commands initiated meanwhile queue
/// up behind it: the deterministic "not yet run" window.
class ProgressBlocker {
 public:
  explicit ProgressBlocker(RdmaBackend& backend) : entered_(shared_->entered.get_future()) {
    backend.async_peer_offer([s = shared_](Result<PeerOffer>) {
      s->entered.set_value();
      s->released.wait();
    });
  }
  ~ProgressBlocker() { release(); }
  ProgressBlocker(const ProgressBlocker&) = delete;
  ProgressBlocker& operator=(const ProgressBlocker&) = delete;

  /// Whether the progress thread is now held.
  [[nodiscard]] bool blocked(std::chrono::milliseconds limit = answer_limit) {
    return entered_.wait_for(limit) == std::future_status::ready;
  }
  void release() {
    if (released_) return;
    released_ = true;
    shared_->release.set_value();
  }

 private:
  struct Shared {
    std::promise<void> entered;
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::future<void> entered_;
  bool released_ = false;
};

// ---- memory ----------------------------------------------------------------

inline std::uint64_t address(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

/// A cheap pattern that differs between seeds at every word.
inline void fill(std::byte* p, std::size_t n, std::uint64_t seed) {
  const std::uint64_t salt = (seed + 1) * 0xC2B2AE3D27D4EB4FULL;
  std::size_t i = 0;
  for (; i + sizeof(std::uint64_t) <= n; i += sizeof(std::uint64_t)) {
    const std::uint64_t word = ((i + 1) * 0x9E3779B97F4A7C15ULL) ^ salt;
    std::memcpy(p + i, &word, sizeof word);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(((i + 1) * 0x9E3779B97F4A7C15ULL ^ salt) >> 56);
}

inline bool same_bytes(const std::byte* a, const std::byte* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

inline std::vector<std::byte> copy_of(const std::byte* p, std::size_t n) { return {p, p + n}; }

/// After a transfer of `len` bytes from `source` into `written` at `offset`:
/// the slice holds the source's bytes, and every other byte of the
/// `region_len`-byte region is as it was (`before`).
inline void expect_only_slice_written(const std::byte* written, const std::vector<std::byte>& before, std::size_t offset,
                               const std::byte* source, std::size_t len, std::size_t region_len) {
  EXPECT_TRUE(same_bytes(written + offset, source, len)) << "the slice holds the wrong bytes";
  EXPECT_TRUE(same_bytes(written, before.data(), offset)) << "bytes before the slice changed";
  const std::size_t end = offset + len;
  EXPECT_TRUE(same_bytes(written + end, before.data() + end, region_len - end)) << "bytes after the slice changed";
}

// ---- two connected backends ------------------------------------------------

struct Pair {
  ContractSubject initiator;
  ContractSubject target;
  PeerId peer{};  ///< the initiator's name for the target
};

/// Makes two fresh subjects and connects them by offer / accept / complete;
/// the initiator then gets from and puts to the target.
inline void connect(const ContractParam& param, Pair& pair) {
  pair.initiator = param.make();
  pair.target = param.make();
  ASSERT_TRUE(pair.initiator.backend);
  ASSERT_TRUE(pair.target.backend);
  auto offer = call<PeerOffer>([&](auto h) { pair.initiator.backend->async_peer_offer(std::move(h)); });
  ASSERT_TRUE(offer) << describe(offer);
  auto answer = call<PeerAnswer>(
      [&](auto h) { pair.target.backend->async_peer_accept(offer.value().blob, std::move(h)); });
  ASSERT_TRUE(answer) << describe(answer);
  auto completed = call<void>([&](auto h) {
    pair.initiator.backend->async_peer_complete(offer.value().peer, answer.value().blob, std::move(h));
  });
  ASSERT_TRUE(completed) << describe(completed);
  pair.peer = offer.value().peer;
}

inline void expect_covers(const BackendRegion& region, const void* ptr, std::size_t len, Access access) {
  // Wider than the request is fine (page rounding); narrower is not.
  EXPECT_LE(region.effective_addr, address(ptr));
  EXPECT_GE(region.effective_addr + region.effective_len, address(ptr) + len);
  // Memory exported to peers comes with a key; local-only memory may not.
  if (access != Access::local) {
    EXPECT_FALSE(region.packed_key.empty()) << "an exported region without a key";
  }
  EXPECT_LE(region.packed_key.size(), max_packed_key_size);
}

inline constexpr asio::cancellation_type all_cancellation_types[] = {
    asio::cancellation_type::terminal, asio::cancellation_type::partial, asio::cancellation_type::total};

}  // namespace corma::contract
