// The backend contract for atomics and flush: counts that come out exact
// under contention, every refusal before the provider, flush making earlier
// puts visible, and atomics and flushes answered once through cancellation,
// peer loss and shutdown.
#include "contract/backend_contract.hpp"
#include "contract/contract_helpers.hpp"

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

namespace corma::contract {
namespace {

Result<std::uint64_t> atomic(RdmaBackend& backend, AtomicRequest request,
                             std::chrono::milliseconds limit = answer_limit) {
  return call<std::uint64_t>([&](auto h) { backend.async_atomic(std::move(request), std::move(h)); }, limit);
}

Result<void> flush(RdmaBackend& backend, PeerId peer) {
  return call<void>([&](auto h) { backend.async_flush(peer, std::move(h)); });
}

/// Connects one more initiator to `target`; its name for the target.
PeerId join(const ContractParam& param, ContractSubject& target, ContractSubject& initiator) {
  initiator = param.make();
  auto offer = call<PeerOffer>([&](auto h) { initiator.backend->async_peer_offer(std::move(h)); });
  EXPECT_TRUE(offer) << describe(offer);
  if (!offer) return PeerId{};
  auto answer = call<PeerAnswer>([&](auto h) { target.backend->async_peer_accept(offer.value().blob, std::move(h)); });
  EXPECT_TRUE(answer) << describe(answer);
  if (!answer) return PeerId{};
  auto completed = call<void>([&](auto h) {
    initiator.backend->async_peer_complete(offer.value().peer, answer.value().blob, std::move(h));
  });
  EXPECT_TRUE(completed) << describe(completed);
  return offer.value().peer;
}

/// A page of 8-byte words on the target, registered for atomics.
struct Words {
  Words(RdmaBackend& target, Access access = Access::remote_atomic) : memory(OwnedBuffer::allocate(4096)) {
    std::fill(memory.data(), memory.data() + memory.size(), std::byte{0});
    auto mapped = map(target, memory.data(), memory.size(), access);
    EXPECT_TRUE(mapped) << describe(mapped);
    if (mapped) key = mapped.value().packed_key;
  }
  [[nodiscard]] std::uint64_t addr(std::size_t word) const { return address(memory.data()) + word * 8; }
  [[nodiscard]] std::uint64_t load(std::size_t word) const {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(memory.data() + word * 8)).load();
  }
  void store(std::size_t word, std::uint64_t value) {
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(memory.data() + word * 8)).store(value);
  }
  OwnedBuffer memory;
  PackedKey key;
};

AtomicRequest on(PeerId peer, const Words& words, std::size_t word, AtomicOp op, std::uint64_t operand,
                 std::uint64_t compare = 0) {
  return AtomicRequest{peer, op, words.addr(word), operand, compare, words.key};
}

/// One target with a page of atomic words and `n` initiators connected to it.
struct ManyInitiators {
  ManyInitiators(const ContractParam& param, int n) : target(param.make()), words(*target.backend), sides(n) {
    for (auto& side : sides) peers.push_back(join(param, target, side));
  }
  ContractSubject target;
  Words words;
  std::vector<ContractSubject> sides;
  std::vector<PeerId> peers;
};

}  // namespace

TEST_P(BackendContract, FetchAddsFromManyInitiatorsEndAtExactlyTheirSumAndEachSeesADistinctValue) {
  constexpr int initiators = 3;
  constexpr int adds = 200;
  ManyInitiators many(GetParam(), initiators);
  auto& [target, words, sides, peers] = many;

  // Every add is in flight at once: each initiator issues all of its own
  // before any answer is awaited.
  std::vector<std::vector<Answer<std::uint64_t>>> answers(initiators);
  for (auto& per_initiator : answers) per_initiator.resize(adds);  // each its own (a copy would share one)
  {
    Initiating scope;
    for (int i = 0; i < initiators; ++i) {
      for (auto& a : answers[i]) sides[i].backend->async_atomic(on(peers[i], words, 3, AtomicOp::fetch_add, 1), a.handler());
    }
  }
  std::set<std::uint64_t> seen;
  for (auto& per_initiator : answers) {
    for (auto& a : per_initiator) {
      auto r = a.wait();
      ASSERT_TRUE(r.has_value()) << "a fetch_add was never answered";
      ASSERT_TRUE(*r) << describe(*r);
      seen.insert(r->value());
      EXPECT_EQ(a.calls(), 1);
    }
  }
  EXPECT_EQ(words.load(3), std::uint64_t{initiators * adds});
  EXPECT_EQ(seen.size(), std::size_t{initiators * adds}) << "two fetch_adds saw the same old value";
  EXPECT_EQ(*seen.rbegin(), std::uint64_t{initiators * adds - 1});
  EXPECT_EQ(words.load(2) | words.load(4), 0u) << "a neighbouring word changed";
}

TEST_P(BackendContract, ACompareSwapCounterUnderContentionLosesNoIncrement) {
  constexpr int threads = 3;
  constexpr int increments = 60;
  ManyInitiators many(GetParam(), threads);
  auto& [target, words, sides, peers] = many;

  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::uint64_t expected = 0;
      for (int done = 0; done < increments;) {
        auto old = atomic(*sides[t].backend, on(peers[t], words, 0, AtomicOp::compare_swap, expected + 1, expected));
        if (!old) {
          ++failures;
          return;
        }
        if (old.value() == expected) ++done;
        expected = old.value() == expected ? expected + 1 : old.value();
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(words.load(0), std::uint64_t{threads * increments});
}

TEST_P(BackendContract, EachAtomicAnswersTheOldValueAndStoresWhatItSays) {
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  Words words(*pair.target.backend);
  words.store(1, 40);

  auto added = atomic(initiator, on(pair.peer, words, 1, AtomicOp::add, 2));
  ASSERT_TRUE(added) << describe(added);
  EXPECT_EQ(added.value(), 0u) << "add fetches nothing";
  EXPECT_EQ(words.load(1), 42u);

  auto fetched = atomic(initiator, on(pair.peer, words, 1, AtomicOp::fetch_add, u64_max));  // wraps: minus one
  EXPECT_EQ(fetched.value(), 42u);
  EXPECT_EQ(words.load(1), 41u);

  auto swapped = atomic(initiator, on(pair.peer, words, 1, AtomicOp::swap, 0xfeedULL));
  EXPECT_EQ(swapped.value(), 41u);
  EXPECT_EQ(words.load(1), 0xfeedULL);

  auto missed = atomic(initiator, on(pair.peer, words, 1, AtomicOp::compare_swap, 7, 8));
  EXPECT_EQ(missed.value(), 0xfeedULL);
  EXPECT_EQ(words.load(1), 0xfeedULL) << "a compare_swap whose comparison failed stored";
  auto hit = atomic(initiator, on(pair.peer, words, 1, AtomicOp::compare_swap, 7, 0xfeedULL));
  EXPECT_EQ(hit.value(), 0xfeedULL);
  EXPECT_EQ(words.load(1), 7u);

  // The last word of the region is inside it.
  auto last = atomic(initiator, on(pair.peer, words, 4096 / 8 - 1, AtomicOp::fetch_add, 5));
  ASSERT_TRUE(last) << describe(last);
  EXPECT_EQ(words.load(4096 / 8 - 1), 5u);
}

TEST_P(BackendContract, AtomicsOnWordsTheyMayNotTouchAreRefusedAndTouchNothing) {
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  Words words(*pair.target.backend);
  Words writable(*pair.target.backend, Access::remote_read_write);

  auto not_atomic = atomic(initiator, on(pair.peer, writable, 0, AtomicOp::fetch_add, 1));
  EXPECT_TRUE(failed_with(not_atomic, errc::not_owned)) << describe(not_atomic);

  auto misaligned = on(pair.peer, words, 0, AtomicOp::fetch_add, 1);
  misaligned.remote_addr += 4;
  EXPECT_TRUE(failed_with(atomic(initiator, misaligned), errc::out_of_range));
  auto past_end = on(pair.peer, words, 4096 / 8, AtomicOp::swap, 1);
  EXPECT_TRUE(failed_with(atomic(initiator, past_end), errc::out_of_range));
  auto below = on(pair.peer, words, 0, AtomicOp::swap, 1);
  below.remote_addr -= 8;
  EXPECT_TRUE(failed_with(atomic(initiator, below), errc::out_of_range));

  auto forged = on(pair.peer, words, 0, AtomicOp::add, 1);
  auto& packed = std::get<PackedKey>(forged.key);
  packed[packed.size() / 2] ^= std::byte{0x5a};
  EXPECT_TRUE(is_corma_error(atomic(initiator, forged))) << "a key with a byte flipped";
  EXPECT_TRUE(failed_with(atomic(initiator, AtomicRequest{pair.peer, AtomicOp::add, words.addr(0), 1, 0, PackedKey{}}),
                          errc::invalid_key));
  EXPECT_TRUE(failed_with(atomic(initiator, on(PeerId{987654}, words, 0, AtomicOp::add, 1)), errc::peer_unreachable));

  for (std::size_t w = 0; w < 4096 / 8; ++w) {
    ASSERT_EQ(words.load(w), 0u) << "word " << w;
    ASSERT_EQ(writable.load(w), 0u) << "word " << w;
  }
}

TEST_P(BackendContract, AFlushCompletesOnlyOnceEveryEarlierPutIsAtTheTarget) {
  constexpr std::size_t block = 64 * KiB;
  constexpr int puts = 16;
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto remote_buffer = OwnedBuffer::allocate(block * puts);
  auto local_buffer = OwnedBuffer::allocate(block * puts);
  auto remote = map(*pair.target.backend, remote_buffer.data(), remote_buffer.size(), Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);
  for (int round = 0; round < 4; ++round) {
    fill(local_buffer.data(), local_buffer.size(), 100 + round);
    std::vector<Answer<void>> put_answers(puts);
    Answer<void> flushed;
    {
      Initiating scope;
      for (int i = 0; i < puts; ++i) {
        const std::uint64_t offset = static_cast<std::uint64_t>(i) * block;
        initiator.async_put(PutRequest{pair.peer, local.value().id, offset, address(remote_buffer.data()) + offset,
                                       block, remote.value().packed_key},
                            put_answers[i].handler());
      }
      initiator.async_flush(pair.peer, flushed.handler());
    }
    auto f = flushed.wait();
    ASSERT_TRUE(f.has_value()) << "the flush was never answered";
    ASSERT_TRUE(*f) << describe(*f);
    EXPECT_TRUE(same_bytes(remote_buffer.data(), local_buffer.data(), remote_buffer.size()))
        << "round " << round << ": a put issued before the flush is not at the target";
    for (auto& p : put_answers) {
      auto r = p.wait();
      ASSERT_TRUE(r.has_value());
      EXPECT_TRUE(*r) << describe(*r);
    }
  }
  // Nothing to flush: answered all the same.
  EXPECT_TRUE(flush(initiator, pair.peer));
  EXPECT_TRUE(failed_with(flush(initiator, PeerId{987654}), errc::peer_unreachable));
}

TEST_P(BackendContract, AtomicsAndFlushesCancelledBeforeTheyRunAreAnsweredCancelledOnce) {
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  Words words(*pair.target.backend);
  asio::cancellation_signal atomic_signal;
  asio::cancellation_signal flush_signal;
  Answer<std::uint64_t> atomic_answer;
  Answer<void> flush_answer;
  {
    ProgressBlocker blocker(initiator);
    ASSERT_TRUE(blocker.blocked());
    {
      Initiating scope;
      initiator.async_atomic(on(pair.peer, words, 0, AtomicOp::fetch_add, 1),
                             asio::bind_cancellation_slot(atomic_signal.slot(), atomic_answer.handler()));
      initiator.async_flush(pair.peer, asio::bind_cancellation_slot(flush_signal.slot(), flush_answer.handler()));
    }
    atomic_signal.emit(asio::cancellation_type::terminal);
    flush_signal.emit(asio::cancellation_type::terminal);
  }
  auto a = atomic_answer.wait();
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(failed_with(*a, errc::cancelled)) << describe(*a);
  auto f = flush_answer.wait();
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(failed_with(*f, errc::cancelled)) << describe(*f);
  EXPECT_EQ(words.load(0), 0u) << "an atomic cancelled before it ran was applied";
  // The backend goes on: the next atomic runs.
  EXPECT_EQ(atomic(initiator, on(pair.peer, words, 0, AtomicOp::fetch_add, 1)).value(), 0u);
  EXPECT_EQ(atomic_answer.calls(), 1);
  EXPECT_EQ(flush_answer.calls(), 1);
}

TEST_P(BackendContract, ShutdownAndPeerLossAnswerEveryAtomicAndFlush) {
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto& target = *pair.target.backend;
  Words words(target);
  // Wired up first: what is under test is a peer leaving, not a handshake.
  ASSERT_TRUE(atomic(initiator, on(pair.peer, words, 0, AtomicOp::fetch_add, 1)));

  constexpr int pending = 32;
  std::vector<Answer<std::uint64_t>> atomics(pending);
  Answer<void> flushed;
  Answer<void> target_down;
  {
    Initiating scope;
    for (auto& a : atomics) initiator.async_atomic(on(pair.peer, words, 1, AtomicOp::fetch_add, 1), a.handler());
    initiator.async_flush(pair.peer, flushed.handler());
    target.async_shutdown(target_down.handler());
  }
  const auto deadline = Clock::now() + GetParam().peer_failure_limit;
  for (auto& a : atomics) {
    auto r = a.wait_until(deadline);
    ASSERT_TRUE(r.has_value()) << "an atomic was not answered within the peer failure limit";
    EXPECT_TRUE(*r || is_corma_error(*r)) << describe(*r);
  }
  auto f = flushed.wait_until(deadline);
  ASSERT_TRUE(f.has_value()) << "the flush was not answered within the peer failure limit";
  EXPECT_TRUE(*f || is_corma_error(*f)) << describe(*f);
  ASSERT_TRUE(target_down.wait().has_value());
  EXPECT_LE(words.load(1), std::uint64_t{pending}) << "an atomic applied twice";

  auto after = atomic(initiator, on(pair.peer, words, 0, AtomicOp::fetch_add, 1), GetParam().peer_failure_limit);
  EXPECT_TRUE(is_corma_error(after)) << "an atomic on a peer that shut down: " << describe(after);

  // The initiator's own shutdown answers what it is given afterwards.
  auto down = call<void>([&](auto h) { initiator.async_shutdown(std::move(h)); });
  EXPECT_TRUE(down) << describe(down);
  EXPECT_TRUE(failed_with(atomic(initiator, on(pair.peer, words, 0, AtomicOp::add, 1)), errc::shutting_down));
  EXPECT_TRUE(failed_with(flush(initiator, pair.peer), errc::shutting_down));
  for (auto& a : atomics) EXPECT_EQ(a.calls(), 1);
  EXPECT_EQ(flushed.calls(), 1);
}

}  // namespace corma::contract
