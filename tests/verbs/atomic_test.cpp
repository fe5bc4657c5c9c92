// The verbs backend's atomics and flushes over the software provider: the
// work requests atomics become (fetch-and-add, compare-and-swap, the swap's
// compare-and-swap loop) and the scratch words their old values land in,
// the refusals made before any work request is posted, a device without
// atomics, and flushes that wait for the peer's earlier work (posted or
// still in the backlog) and are answered when it fails, the peer closes or
// the caller gives up.
#include "verbs/backend_fixture.hpp"

#include "wire.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <atomic>
#include <set>
#include <thread>

namespace corma::verbs {
namespace {

using testing::SoftVerbsConfig;
using namespace std::chrono_literals;

bool failed_with(const Result<std::uint64_t>& r, errc code) { return !r && r.error().is(code); }

/// Whether `future` is answered within `limit`.
template <class T>
bool ready(const std::future<T>& future, std::chrono::milliseconds limit = 0ms) {
  return future.wait_for(limit) == std::future_status::ready;
}

class VerbsAtomics : public VerbsBackend {
 protected:
  /// `a` connected to `b`, which registered a page of 8-byte words.
  struct WordLink {
    std::shared_ptr<Backend> a, b;
    PeerId peer{};
    std::vector<std::uint64_t> words = std::vector<std::uint64_t>(512);
    BackendRegion region;

    [[nodiscard]] std::uint64_t addr(std::size_t word) const {
      return reinterpret_cast<std::uint64_t>(words.data() + word);
    }
    [[nodiscard]] AtomicRequest on(std::size_t word, AtomicOp op, std::uint64_t operand,
                                   std::uint64_t compare = 0) const {
      return AtomicRequest{peer, op, addr(word), operand, compare, region.packed_key};
    }
    [[nodiscard]] Result<std::uint64_t> apply(AtomicRequest request) const {
      return answered(a->async_atomic(std::move(request), asio::use_future));
    }
    // The provider changes the words on its own thread, atomically.
    std::uint64_t load(std::size_t word) { return std::atomic_ref<std::uint64_t>(words[word]).load(); }
    void store(std::size_t word, std::uint64_t value) { std::atomic_ref<std::uint64_t>(words[word]).store(value); }
  };

  WordLink word_link(Access access = Access::remote_atomic, Config a_config = {}) {
    WordLink l;
    l.a = make(a_config);
    l.b = make();
    l.peer = connect(*l.a, *l.b);
    l.region = answered(l.b->async_map(l.words.data(), l.words.size() * sizeof(std::uint64_t), access,
                                       asio::use_future))
                   .value();
    return l;
  }
};

// ---- atomics that apply ----------------------------------------------------

TEST_F(VerbsAtomics, FetchAddsFromFourThreadsEndAtExactlyTwoThousandEachSeeingADistinctValue) {
  constexpr int threads = 4;
  constexpr int adds = 500;
  // 32 scratch words (one per completion-queue entry) for 2000 atomics in
  // flight at once: the words are reused, never exhausted.
  Config tight;
  tight.send_queue_depth = 16;
  tight.completion_queue_depth = 32;
  auto l = word_link(Access::remote_atomic, tight);

  std::vector<std::vector<std::uint64_t>> seen(threads);
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<std::future<Result<std::uint64_t>>> answers;
      for (int i = 0; i < adds; ++i) {
        answers.push_back(l.a->async_atomic(l.on(0, AtomicOp::fetch_add, 1), asio::use_future));
      }
      for (auto& answer : answers) {
        if (!ready(answer, 10s)) {
          ++failures;
          continue;
        }
        auto r = answer.get();
        if (r) {
          seen[static_cast<std::size_t>(t)].push_back(r.value());
        } else {
          ++failures;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(l.load(0), std::uint64_t{threads * adds});
  std::set<std::uint64_t> distinct;
  for (const auto& per_thread : seen) distinct.insert(per_thread.begin(), per_thread.end());
  EXPECT_EQ(distinct.size(), std::size_t{threads * adds}) << "two fetch_adds saw the same old value";
  EXPECT_EQ(*distinct.rbegin(), std::uint64_t{threads * adds - 1});
  EXPECT_EQ(l.load(1), 0u) << "the next word changed";
  EXPECT_EQ(fabric.work_requests_posted(), std::size_t{threads * adds}) << "one work request per fetch_add";
  EXPECT_LE(fabric.max_outstanding(), tight.send_queue_depth);
}

TEST_F(VerbsAtomics, CompareSwapStoresOnlyOnAMatchAndAnswersTheOldValue) {
  auto l = word_link();
  l.store(2, 10);
  auto missed = l.apply(l.on(2, AtomicOp::compare_swap, 20, 11));
  ASSERT_TRUE(missed) << missed.error().message();
  EXPECT_EQ(missed.value(), 10u);
  EXPECT_EQ(l.load(2), 10u) << "a compare_swap whose comparison failed stored";
  auto hit = l.apply(l.on(2, AtomicOp::compare_swap, 20, 10));
  ASSERT_TRUE(hit) << hit.error().message();
  EXPECT_EQ(hit.value(), 10u);
  EXPECT_EQ(l.load(2), 20u);
  EXPECT_EQ(fabric.work_requests_posted(), 2u) << "a compare_swap is one work request, hit or miss";

  auto added = l.apply(l.on(2, AtomicOp::add, 5));
  ASSERT_TRUE(added) << added.error().message();
  EXPECT_EQ(added.value(), 0u) << "add answers 0";
  EXPECT_EQ(l.load(2), 25u);
}

TEST_F(VerbsAtomics, SwapAnswersTheOldValueAndStoresTheNewThroughCompareAndSwaps) {
  auto l = word_link();
  auto from_zero = l.apply(l.on(3, AtomicOp::swap, 7));
  ASSERT_TRUE(from_zero) << from_zero.error().message();
  EXPECT_EQ(from_zero.value(), 0u);
  EXPECT_EQ(l.load(3), 7u);
  EXPECT_EQ(fabric.work_requests_posted(), 1u) << "the first guess, 0, matched";

  auto again = l.apply(l.on(3, AtomicOp::swap, 0xfeed));
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again.value(), 7u);
  EXPECT_EQ(l.load(3), 0xfeedu);
  EXPECT_EQ(fabric.work_requests_posted(), 3u) << "a miss expecting 0, then a hit expecting what the miss saw";
}

TEST_F(VerbsAtomics, ContendedSwapsAreLinearizable) {
  // Every value swapped in is replaced exactly once (its replacer answers
  // it) or is the word's final value; the initial 0 is answered once.
  constexpr std::uint64_t threads = 4;
  constexpr std::uint64_t swaps = 40;
  auto l = word_link();
  std::vector<std::vector<std::uint64_t>> answered_by(threads);
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (std::uint64_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<std::future<Result<std::uint64_t>>> answers;
      for (std::uint64_t i = 0; i < swaps; ++i) {
        answers.push_back(l.a->async_atomic(l.on(0, AtomicOp::swap, ((t + 1) << 32) | (i + 1)), asio::use_future));
      }
      for (auto& answer : answers) {
        auto r = ready(answer, 20s) ? answer.get() : Result<std::uint64_t>(fail(errc::timeout, "no answer"));
        if (r) {
          answered_by[t].push_back(r.value());
        } else {
          ++failures;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  ASSERT_EQ(failures.load(), 0);
  std::multiset<std::uint64_t> replaced;
  for (const auto& per_thread : answered_by) replaced.insert(per_thread.begin(), per_thread.end());
  replaced.insert(l.load(0));
  std::multiset<std::uint64_t> stored{0};
  for (std::uint64_t t = 0; t < threads; ++t) {
    for (std::uint64_t i = 0; i < swaps; ++i) stored.insert(((t + 1) << 32) | (i + 1));
  }
  EXPECT_EQ(replaced, stored);
  EXPECT_GT(fabric.work_requests_posted(), threads * swaps) << "contended swaps retry";
}

TEST_F(VerbsAtomics, AnImportedKeyServesAtomics) {
  auto l = word_link();
  auto key = answered(l.a->async_import_key(l.peer, l.region.packed_key, asio::use_future));
  ASSERT_TRUE(key) << key.error().message();
  auto request = l.on(5, AtomicOp::fetch_add, 3);
  request.key = key.value();
  auto r = l.apply(request);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value(), 0u);
  EXPECT_EQ(l.load(5), 3u);
}

// ---- atomics refused -------------------------------------------------------

TEST_F(VerbsAtomics, ARegionWithoutRemoteAtomicIsRefusedNotOwnedBeforeAnyWorkRequest) {
  auto l = word_link(Access::remote_read_write);
  EXPECT_EQ(wire::decode_key(l.region.packed_key).value().access, Access::remote_read_write);
  auto packed = l.apply(l.on(0, AtomicOp::add, 1));
  EXPECT_TRUE(failed_with(packed, errc::not_owned)) << (packed ? "applied" : packed.error().message());

  auto key = answered(l.a->async_import_key(l.peer, l.region.packed_key, asio::use_future));
  ASSERT_TRUE(key) << key.error().message();
  auto request = l.on(0, AtomicOp::fetch_add, 1);
  request.key = key.value();
  EXPECT_TRUE(failed_with(l.apply(request), errc::not_owned)) << "an imported key keeps its access";

  EXPECT_EQ(fabric.work_requests_posted(), 0u) << "a refused atomic reached the NIC";
  EXPECT_EQ(l.load(0), 0u);
  std::vector<std::byte> sink(8);
  auto local = answered(l.a->async_map(sink.data(), sink.size(), Access::local, asio::use_future)).value();
  GetRequest read{l.peer, local.id, 0, l.addr(0), 8, l.region.packed_key};
  EXPECT_TRUE(answered(l.a->async_get(std::move(read), asio::use_future))) << "a refusal does not break the peer";
}

TEST_F(VerbsAtomics, WordsMisalignedOrOutsideTheKeyAreRefusedOutOfRangeBeforeAnyWorkRequest) {
  auto l = word_link();
  auto misaligned = l.on(0, AtomicOp::fetch_add, 1);
  misaligned.remote_addr += 4;
  EXPECT_TRUE(failed_with(l.apply(misaligned), errc::out_of_range));
  EXPECT_TRUE(failed_with(l.apply(l.on(l.words.size(), AtomicOp::swap, 1)), errc::out_of_range)) << "past the end";
  auto below = l.on(0, AtomicOp::compare_swap, 1);
  below.remote_addr -= 8;
  EXPECT_TRUE(failed_with(l.apply(below), errc::out_of_range));
  EXPECT_TRUE(failed_with(l.apply(AtomicRequest{l.peer, AtomicOp::add, l.addr(0), 1, 0, PackedKey{}}),
                          errc::invalid_key));
  auto unknown = l.on(0, AtomicOp::add, 1);
  unknown.peer = PeerId{987654};
  EXPECT_TRUE(failed_with(l.apply(unknown), errc::peer_unreachable));
  EXPECT_EQ(fabric.work_requests_posted(), 0u);
  for (std::size_t w = 0; w < l.words.size(); ++w) ASSERT_EQ(l.load(w), 0u) << w;
}

TEST_F(VerbsAtomics, AForgedKeyClaimingAtomicsIsStillRefusedByTheNic) {
  auto l = word_link(Access::remote_read_write);
  // The initiator believes the key; the target's MR has no remote atomic
  // access, and the NIC's check is what stops the atomic.
  auto genuine = wire::decode_key(l.region.packed_key).value();
  genuine.access = Access::remote_atomic;
  auto request = l.on(0, AtomicOp::fetch_add, 1);
  request.key = wire::encode_key(genuine);
  auto r = l.apply(request);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::backend)) << r.error().message();
  EXPECT_EQ(r.error().cause.category(), completion_category());
  EXPECT_EQ(r.error().cause.value(), IBV_WC_REM_ACCESS_ERR);
  EXPECT_NE(r.error().detail.find("FETCH_AND_ADD"), std::string::npos) << r.error().detail;
  EXPECT_EQ(l.load(0), 0u);
  EXPECT_TRUE(failed_with(l.apply(l.on(0, AtomicOp::add, 1)), errc::peer_unreachable))
      << "the error completion broke the peer";
}

TEST_F(VerbsAtomics, ADeviceWithoutAtomicsAnswersNotConfigured) {
  fabric.reset(SoftVerbsConfig{.atomic_cap = IBV_ATOMIC_NONE});
  auto a = make();
  auto b = make();
  const PeerId peer = connect(*a, *b);
  EXPECT_EQ(fabric.live_mrs(), 2u) << "each side's mailbox, and no scratch area without atomics";

  std::vector<std::uint64_t> words(8);
  auto atomic_region = answered(b->async_map(words.data(), 64, Access::remote_atomic, asio::use_future));
  ASSERT_FALSE(atomic_region);
  EXPECT_TRUE(atomic_region.error().is(errc::not_configured)) << atomic_region.error().message();

  auto region = answered(b->async_map(words.data(), 64, Access::remote_read_write, asio::use_future)).value();
  auto claimed = wire::decode_key(region.packed_key).value();
  claimed.access = Access::remote_atomic;
  auto r = answered(a->async_atomic(
      AtomicRequest{peer, AtomicOp::fetch_add, reinterpret_cast<std::uint64_t>(words.data()), 1, 0,
                    wire::encode_key(claimed)},
      asio::use_future));
  EXPECT_TRUE(failed_with(r, errc::not_configured)) << (r ? "applied" : r.error().message());
  EXPECT_EQ(fabric.work_requests_posted(), 0u);
}

// ---- flush -----------------------------------------------------------------

class VerbsFlush : public VerbsBackend {
 protected:
  /// Waits until `backend` tracks `n` transfers (flushes included).
  bool tracking(const Backend& backend, std::size_t n) {
    return fabric.wait_until([&] { return backend.transfers_in_flight() == n; }, 5s);
  }
};

TEST_F(VerbsFlush, AFlushAnswersOnlyOnceEveryEarlierPutIsAtTheTarget) {
  constexpr std::uint32_t depth = 4;
  constexpr std::size_t puts = 16;
  constexpr std::size_t block = 4096;
  Config shallow;
  shallow.send_queue_depth = depth;
  auto l = link(puts * block, 1, Access::remote_read_write, shallow);
  const auto fresh = pattern(puts * block, 77);
  std::copy(fresh.begin(), fresh.end(), l.sink.begin());  // the registered buffer itself

  fabric.hold_work();  // nothing completes: the queue fills, the rest waits in the backlog
  std::vector<std::future<Result<void>>> put_answers;
  for (std::size_t i = 0; i < puts; ++i) put_answers.push_back(l.a->async_put(l.slice(i, block), asio::use_future));
  auto flushed = l.a->async_flush(l.peer, asio::use_future);
  ASSERT_TRUE(tracking(*l.a, puts + 1));
  ASSERT_TRUE(fabric.wait_until([&] { return fabric.work_requests_executing_or_queued() == depth; }, 5s));
  EXPECT_FALSE(ready(flushed, 50ms)) << "a flush answered while puts were still held";
  fabric.release_work();

  auto done = answered(std::move(flushed));
  ASSERT_TRUE(done) << done.error().message();
  EXPECT_EQ(l.source, fresh) << "a put issued before the flush is not at the target";
  for (auto& p : put_answers) {
    ASSERT_TRUE(ready(p)) << "the flush was answered before a put it waited for";
    EXPECT_TRUE(p.get());
  }
  EXPECT_EQ(fabric.work_requests_posted(), puts) << "a flush posts no work request";
}

TEST_F(VerbsFlush, AFlushWaitsForEarlierGetsTooAndWithNothingBeforeItAnswersAtOnce) {
  const auto l = link(8192, 2, Access::remote_read_write);
  fabric.hold_work();
  auto earlier = l.start_get(0, 4096);
  auto flushed = l.a->async_flush(l.peer, asio::use_future);
  ASSERT_TRUE(tracking(*l.a, 2));
  auto later = l.start_get(1, 4096);
  ASSERT_TRUE(tracking(*l.a, 3));
  EXPECT_FALSE(ready(flushed, 20ms));
  fabric.release_work();
  ASSERT_TRUE(answered(std::move(flushed)));
  EXPECT_TRUE(answered(std::move(earlier)));
  EXPECT_TRUE(answered(std::move(later)));

  // Nothing before it: answered at once, with nothing tracked.
  EXPECT_TRUE(answered(l.a->async_flush(l.peer, asio::use_future)));
  EXPECT_EQ(l.a->transfers_in_flight(), 0u);
  auto unknown = answered(l.a->async_flush(PeerId{987654}, asio::use_future));
  ASSERT_FALSE(unknown);
  EXPECT_TRUE(unknown.error().is(errc::peer_unreachable)) << unknown.error().message();
}

TEST_F(VerbsFlush, AFailedPutFailsTheFlushBehindIt) {
  const auto l = link(4096, 3, Access::remote_read_write);
  fabric.hold_work();
  fabric.fail_next_completion(IBV_WC_REM_ACCESS_ERR);
  auto put = l.a->async_put(l.slice(0, 4096), asio::use_future);
  auto flushed = l.a->async_flush(l.peer, asio::use_future);
  ASSERT_TRUE(tracking(*l.a, 2));
  fabric.release_work();

  EXPECT_FALSE(answered(std::move(put)));
  auto r = answered(std::move(flushed));
  ASSERT_FALSE(r) << "a flush vouched for a put that failed";
  EXPECT_TRUE(r.error().is(errc::backend)) << r.error().message();
  EXPECT_EQ(r.error().cause.value(), IBV_WC_REM_ACCESS_ERR);
  EXPECT_NE(r.error().detail.find("flush"), std::string::npos) << r.error().detail;
}

TEST_F(VerbsFlush, ClosingThePeerAnswersAWaitingFlush) {
  const auto l = link(4096, 4, Access::remote_read_write);
  fabric.hold_work();
  auto put = l.a->async_put(l.slice(0, 4096), asio::use_future);
  auto flushed = l.a->async_flush(l.peer, asio::use_future);
  ASSERT_TRUE(tracking(*l.a, 2));
  auto closed = l.a->async_peer_close(l.peer, asio::use_future);
  auto r = answered(std::move(flushed));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::peer_unreachable)) << r.error().message();
  fabric.release_work();
  EXPECT_FALSE(answered(std::move(put)));
  EXPECT_TRUE(answered(std::move(closed)));
  EXPECT_EQ(l.a->transfers_in_flight(), 0u);
}

TEST_F(VerbsFlush, ATerminalCancellationAnswersAWaitingFlushOnce) {
  const auto l = link(4096, 5, Access::remote_read_write);
  fabric.hold_work();
  auto put = l.a->async_put(l.slice(0, 4096), asio::use_future);
  asio::cancellation_signal signal;
  auto flushed = l.a->async_flush(l.peer, asio::bind_cancellation_slot(signal.slot(), asio::use_future));
  ASSERT_TRUE(tracking(*l.a, 2));
  signal.emit(asio::cancellation_type::terminal);
  auto r = answered(std::move(flushed));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::cancelled)) << r.error().message();
  fabric.release_work();
  EXPECT_TRUE(answered(std::move(put)));
  ASSERT_TRUE(fabric.wait_until([&] { return l.a->transfers_in_flight() == 0; }, 5s))
      << "the cancelled flush left the table once its put finished";
}

TEST_F(VerbsFlush, ShutdownAnswersAWaitingFlush) {
  Config quick;
  quick.shutdown_timeout = 100ms;
  const auto l = link(4096, 6, Access::remote_read_write, quick);
  fabric.hold_work();
  auto put = l.a->async_put(l.slice(0, 4096), asio::use_future);
  auto flushed = l.a->async_flush(l.peer, asio::use_future);
  ASSERT_TRUE(tracking(*l.a, 2));
  EXPECT_TRUE(answered(l.a->async_shutdown(asio::use_future)));
  auto r = answered(std::move(flushed));
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::shutting_down)) << r.error().message();
  EXPECT_FALSE(answered(std::move(put)));
  fabric.release_work();
}

}  // namespace
}  // namespace corma::verbs
