// The backend contract for batches (docs/architecture.md, "Batches"): many
// transfers in one submission, one answer naming every failed element, each
// element checked and run exactly as a single transfer would be. Linked into
// every contract executable with contract_test.cpp; same techniques.
#include "contract/backend_contract.hpp"
#include "contract/batch_helpers.hpp"
#include "contract/contract_helpers.hpp"

namespace corma::contract {
namespace {

/// One element of a batch and what it must end with.
struct BatchCase {
  TransferRequest request;
  std::optional<errc> expected;  ///< nullopt: succeeds
  const std::byte* local_base;   ///< the local region's memory
};

/// Runs `cases` as one batch of gets (or puts): each good element moved its
/// bytes, each bad one failed with its own error.
void expect_batch_outcome(RdmaBackend& initiator, const std::vector<BatchCase>& cases, bool is_put) {
  TransferBatch batch;
  for (const auto& c : cases) batch.push_back(c.request);
  auto outcome = is_put ? put_batch(initiator, batch) : get_batch(initiator, batch);
  ASSERT_TRUE(outcome) << describe(outcome);
  expect_well_formed(outcome.value(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto failure = failure_of(outcome.value(), i);
    const auto& r = cases[i].request;
    if (!cases[i].expected) {
      EXPECT_FALSE(failure) << "element " << i << ": " << failure->message();
      EXPECT_TRUE(
          same_bytes(cases[i].local_base + r.local_offset, reinterpret_cast<const std::byte*>(r.remote_addr), r.len))
          << "element " << i << " did not move its bytes";
    } else {
      ASSERT_TRUE(failure) << "element " << i << " succeeded";
      EXPECT_TRUE(failure->is(*cases[i].expected)) << "element " << i << ": " << failure->message();
    }
  }
}

// ===========================================================================
// Every element lands, and each bad one is named with its own error.
// ===========================================================================

TEST_P(BackendContract, BatchGetsAndPutsMoveEveryElementsSlice) {
  constexpr std::size_t slot = 4 * KiB;
  constexpr std::size_t elements = 64;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), slot * elements, m));
  auto& initiator = *m.pair.initiator.backend;
  fill(m.remote_buffer.data(), m.remote_buffer.size(), 7);
  fill(m.local_buffer.data(), m.local_buffer.size(), 8);

  // Element i reads the remote slot (i * 7) % 64 into local slot i, with
  // lengths from 1 byte to a whole slot.
  TransferBatch gets;
  for (std::size_t i = 0; i < elements; ++i) {
    gets.push_back(m.element(i * slot, ((i * 7) % elements) * slot, 1 + (i * 97) % slot));
  }
  auto got = get_batch(initiator, gets);
  ASSERT_TRUE(got) << describe(got);
  expect_well_formed(got.value(), elements);
  EXPECT_TRUE(got.value().all_succeeded()) << got.value().failures.front().error.message();
  for (const auto& e : gets) {
    EXPECT_TRUE(same_bytes(m.local_buffer.data() + e.local_offset,
                           reinterpret_cast<const std::byte*>(e.remote_addr), e.len))
        << "element at local offset " << e.local_offset << " holds the wrong bytes";
  }

  fill(m.local_buffer.data(), m.local_buffer.size(), 9);
  auto written = put_batch(initiator, gets);
  ASSERT_TRUE(written) << describe(written);
  EXPECT_TRUE(written.value().all_succeeded());
  for (const auto& e : gets) {
    EXPECT_TRUE(same_bytes(reinterpret_cast<const std::byte*>(e.remote_addr),
                           m.local_buffer.data() + e.local_offset, e.len))
        << "put element from local offset " << e.local_offset << " left the wrong bytes";
  }
  EXPECT_TRUE(unmap(initiator, m.local.id));
  EXPECT_TRUE(unmap(*m.pair.target.backend, m.remote.id));
}

TEST_P(BackendContract, BatchReportsEachBadElementAndRunsTheGoodOnes) {
  constexpr std::size_t size = 64 * KiB;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), size, m));
  auto& initiator = *m.pair.initiator.backend;
  fill(m.remote_buffer.data(), size, 17);
  fill(m.local_buffer.data(), size, 18);

  std::vector<BatchCase> cases;
  const auto* local = m.local_buffer.data();
  cases.push_back({m.element(0, 0, 512), std::nullopt, local});
  cases.push_back({m.element(0, 0, 0), errc::out_of_range, local});                 // empty
  cases.push_back({m.element(size - 8, 0, 16), errc::out_of_range, local});         // past the local region
  cases.push_back({m.element(1024, size - 8, 16), errc::out_of_range, local});      // past the remote key
  cases.push_back({m.element(2048, 4096, 512), std::nullopt, local});
  auto unknown_region = m.element(0, 0, 8);
  unknown_region.local = RegionId{u64_max};
  cases.push_back({unknown_region, errc::region_not_found, local});
  auto unknown_peer = m.element(0, 0, 8);
  unknown_peer.peer = PeerId{u64_max};
  cases.push_back({unknown_peer, errc::peer_unreachable, local});
  auto garbage_key = m.element(0, 0, 8);
  garbage_key.key = PackedKey(24, std::byte{0x5a});
  cases.push_back({garbage_key, errc::invalid_key, local});
  cases.push_back({m.element(8192, 8192, 4096), std::nullopt, local});

  for (const bool is_put : {false, true}) {
    SCOPED_TRACE(is_put ? "put batch" : "get batch");
    expect_batch_outcome(initiator, cases, is_put);
    fill(m.local_buffer.data(), size, is_put ? 19 : 20);
  }
  EXPECT_EQ(initiator.live_registrations(), 1u);
  EXPECT_TRUE(unmap(initiator, m.local.id));
  EXPECT_TRUE(unmap(*m.pair.target.backend, m.remote.id));
}

// A batch to one peer whose elements alternate between two local regions
// and two of the peer's keys, one of them read-only, with bad elements
// among them: each bad one is refused by its index and moves nothing, the
// others land, and every region is released once the batch is answered.
TEST_P(BackendContract, BatchOverSeveralRegionsAndKeysRefusesEachBadElementAlone) {
  constexpr std::size_t size = 64 * KiB;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), size, m));
  auto& initiator = *m.pair.initiator.backend;
  auto& target = *m.pair.target.backend;
  auto second_local_buffer = OwnedBuffer::allocate(size);
  auto second_local = map(initiator, second_local_buffer.data(), size, Access::local);
  ASSERT_TRUE(second_local) << describe(second_local);
  auto read_only_buffer = OwnedBuffer::allocate(size);
  auto read_only = map(target, read_only_buffer.data(), size, Access::remote_read);
  ASSERT_TRUE(read_only) << describe(read_only);
  fill(m.remote_buffer.data(), size, 61);
  fill(read_only_buffer.data(), size, 62);
  const auto read_only_bytes = copy_of(read_only_buffer.data(), size);

  const auto on_second_region = [&](TransferRequest r) {
    r.local = second_local.value().id;
    return r;
  };
  const auto from_read_only = [&](std::uint64_t local_offset, std::uint64_t remote_offset, std::uint64_t len) {
    return TransferRequest{m.pair.peer, m.local.id, local_offset, address(read_only_buffer.data()) + remote_offset,
                           len, read_only.value().packed_key};
  };
  for (const bool is_put : {false, true}) {
    SCOPED_TRACE(is_put ? "put batch" : "get batch");
    fill(m.local_buffer.data(), size, is_put ? 63 : 64);
    fill(second_local_buffer.data(), size, is_put ? 65 : 66);
    const std::vector<BatchCase> cases{
        {m.element(0, 0, 4096), std::nullopt, m.local_buffer.data()},
        {on_second_region(m.element(4096, 8192, 4096)), std::nullopt, second_local_buffer.data()},
        {from_read_only(8192, 0, 4096), is_put ? std::optional(errc::not_owned) : std::nullopt,
         m.local_buffer.data()},
        {m.element(size - 8, 0, 16), errc::out_of_range, m.local_buffer.data()},
        {on_second_region(m.element(0, size - 8, 16)), errc::out_of_range, second_local_buffer.data()},
        {from_read_only(16384, 16384, 4096), is_put ? std::optional(errc::not_owned) : std::nullopt,
         m.local_buffer.data()},
        {on_second_region(m.element(32768, 32768, 4096)), std::nullopt, second_local_buffer.data()},
    };
    expect_batch_outcome(initiator, cases, is_put);
    if (is_put) {
      EXPECT_TRUE(same_bytes(read_only_buffer.data(), read_only_bytes.data(), size))
          << "a put refused by its key's access reached the peer's memory";
    }
  }
  // Nothing of the batch pins a region any more.
  EXPECT_TRUE(unmap(initiator, second_local.value().id));
  EXPECT_TRUE(unmap(initiator, m.local.id));
  EXPECT_EQ(initiator.live_registrations(), 0u);
  EXPECT_TRUE(unmap(target, read_only.value().id));
  EXPECT_TRUE(unmap(target, m.remote.id));
}

TEST_P(BackendContract, EmptyAndOversizedBatchesAreAnsweredWhole) {
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), 4 * KiB, m));
  auto& initiator = *m.pair.initiator.backend;
  auto empty = get_batch(initiator, {});
  ASSERT_TRUE(empty) << describe(empty);
  EXPECT_EQ(empty.value().size, 0u);
  EXPECT_TRUE(empty.value().all_succeeded());

  TransferBatch oversized(max_batch_size + 1, m.element(0, 0, 8));
  auto refused = get_batch(initiator, oversized);
  EXPECT_TRUE(failed_with(refused, errc::out_of_range)) << describe(refused);
  auto refused_put = put_batch(initiator, std::move(oversized));
  EXPECT_TRUE(failed_with(refused_put, errc::out_of_range)) << describe(refused_put);

  // The longest batch allowed runs.
  TransferBatch longest(max_batch_size, m.element(0, 0, 8));
  auto ran = get_batch(initiator, std::move(longest));
  ASSERT_TRUE(ran) << describe(ran);
  EXPECT_TRUE(ran.value().all_succeeded()) << ran.value().failures.size() << " failed, the first: element "
                                           << ran.value().failures.front().index << ": "
                                           << ran.value().failures.front().error.message();
}

// ===========================================================================
// Cancellation: terminal answers at once; the regions outlive the transfers.
// ===========================================================================

TEST_P(BackendContract, CancelledBatchAnswersOnceAndItsRegionOutlivesItsTransfers) {
  constexpr std::size_t slot = 1 * MiB;
  constexpr std::size_t elements = 16;
  // Declared first: outlives the backends, whose threads post into it.
  asio::io_context io;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), slot * elements, m));
  auto& initiator = *m.pair.initiator.backend;
  if (m.pair.initiator.set_transfer_delay) m.pair.initiator.set_transfer_delay(200ms);
  TransferBatch batch;
  for (std::size_t i = 0; i < elements; ++i) batch.push_back(m.element(i * slot, i * slot, slot));

  for (const bool hold_progress : {true, false}) {
    SCOPED_TRACE(hold_progress ? "cancelled before the batch ran" : "cancelled while it runs");
    asio::cancellation_signal signal;
    std::optional<Result<BatchOutcome>> outcome;
    int calls = 0;
    {
      std::optional<ProgressBlocker> blocker;
      if (hold_progress) {
        blocker.emplace(initiator);
        ASSERT_TRUE(blocker->blocked()) << "the progress thread never ran the blocking callback";
      }
      initiator.async_get_batch(batch, asio::bind_cancellation_slot(
                                           signal.slot(), asio::bind_executor(io, [&](Result<BatchOutcome> r) {
                                             ++calls;
                                             outcome = std::move(r);
                                           })));
      signal.emit(asio::cancellation_type::terminal);
    }
    ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the cancelled batch was never answered";
    ASSERT_TRUE(*outcome) << describe(*outcome);
    expect_well_formed(outcome->value(), elements);
    for (const auto& failure : outcome->value().failures) {
      EXPECT_TRUE(failure.error.is(errc::cancelled)) << "element " << failure.index << ": " << failure.error.message();
    }
    if (hold_progress) {
      EXPECT_EQ(outcome->value().failures.size(), elements) << "an element cancelled before it ran still ran";
    }
    drain(io);
    EXPECT_EQ(calls, 1);
  }
  // The local region is released only once every element really ended.
  Answer<void> unmapped;
  {
    Initiating scope;
    initiator.async_unmap(m.local.id, unmapped.handler());
  }
  const auto u = unmapped.wait();
  ASSERT_TRUE(u.has_value()) << "the unmap was never answered";
  EXPECT_TRUE(*u) << describe(*u);
  if (m.pair.initiator.transfers_in_flight) {
    EXPECT_EQ(m.pair.initiator.transfers_in_flight(), 0u)
        << "the unmap was answered while an element into the region still ran";
  }
  EXPECT_EQ(initiator.live_registrations(), 0u);
}

TEST_P(BackendContract, PartialOrTotalCancellationLeavesABatchToItsRealResult) {
  constexpr std::size_t slot = 64 * KiB;
  constexpr std::size_t elements = 8;
  asio::io_context io;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), slot * elements, m));
  auto& initiator = *m.pair.initiator.backend;
  fill(m.remote_buffer.data(), m.remote_buffer.size(), 31);
  TransferBatch batch;
  for (std::size_t i = 0; i < elements; ++i) batch.push_back(m.element(i * slot, i * slot, slot));

  for (const auto type : {asio::cancellation_type::partial, asio::cancellation_type::total}) {
    fill(m.local_buffer.data(), m.local_buffer.size(), 32);
    asio::cancellation_signal signal;
    std::optional<Result<BatchOutcome>> outcome;
    {
      ProgressBlocker blocker(initiator);
      ASSERT_TRUE(blocker.blocked());
      initiator.async_get_batch(batch, asio::bind_cancellation_slot(
                                           signal.slot(), asio::bind_executor(io, [&](Result<BatchOutcome> r) {
                                             outcome = std::move(r);
                                           })));
      signal.emit(type);
    }
    ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the batch was never answered";
    ASSERT_TRUE(*outcome) << describe(*outcome);
    EXPECT_TRUE(outcome->value().all_succeeded()) << "a partial or total signal stopped an element";
    EXPECT_TRUE(same_bytes(m.local_buffer.data(), m.remote_buffer.data(), m.local_buffer.size()));
    drain(io);
  }
}

// ===========================================================================
// Unmap, shutdown and a lost peer answer every batch once.
// ===========================================================================

TEST_P(BackendContract, UnmapQueuedBehindABatchWaitsForItsElements) {
  constexpr std::size_t slot = 256 * KiB;
  constexpr std::size_t elements = 8;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), slot * elements, m));
  auto& initiator = *m.pair.initiator.backend;
  if (m.pair.initiator.set_transfer_delay) m.pair.initiator.set_transfer_delay(50ms);
  fill(m.remote_buffer.data(), m.remote_buffer.size(), 51);
  TransferBatch batch;
  for (std::size_t i = 0; i < elements; ++i) batch.push_back(m.element(i * slot, i * slot, slot));

  Answer<BatchOutcome> first;
  Answer<void> unmapped;
  Answer<BatchOutcome> second;
  {
    ProgressBlocker blocker(initiator);
    ASSERT_TRUE(blocker.blocked());
    Initiating scope;
    initiator.async_get_batch(batch, first.handler());
    initiator.async_unmap(m.local.id, unmapped.handler());
    initiator.async_get_batch(batch, second.handler());
  }
  const auto f = first.wait();
  ASSERT_TRUE(f.has_value()) << "the batch was never answered";
  ASSERT_TRUE(*f) << describe(*f);
  EXPECT_TRUE(f->value().all_succeeded()) << "an element admitted before the unmap failed";
  EXPECT_TRUE(same_bytes(m.local_buffer.data(), m.remote_buffer.data(), m.local_buffer.size()));
  const auto u = unmapped.wait();
  ASSERT_TRUE(u.has_value()) << "the unmap was never answered";
  EXPECT_TRUE(*u) << describe(*u);
  const auto s = second.wait();
  ASSERT_TRUE(s.has_value()) << "the batch behind the unmap was never answered";
  ASSERT_TRUE(*s) << describe(*s);
  ASSERT_EQ(s->value().failures.size(), elements) << "an element ran into an unmapping region";
  for (const auto& failure : s->value().failures) EXPECT_TRUE(failure.error.is(errc::region_not_found));
  EXPECT_EQ(initiator.live_registrations(), 0u);
  EXPECT_EQ(first.calls(), 1);
  EXPECT_EQ(second.calls(), 1);
}

TEST_P(BackendContract, ShutdownAnswersABatchInFlightAndRefusesLaterOnes) {
  constexpr std::size_t slot = 256 * KiB;
  constexpr std::size_t elements = 16;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), slot * elements, m));
  auto& initiator = *m.pair.initiator.backend;
  TransferBatch batch;
  for (std::size_t i = 0; i < elements; ++i) batch.push_back(m.element(i * slot, i * slot, slot));

  Answer<BatchOutcome> in_flight;
  Answer<void> down;
  {
    Initiating scope;
    initiator.async_get_batch(batch, in_flight.handler());
    initiator.async_shutdown(down.handler());
  }
  const auto outcome = in_flight.wait();
  ASSERT_TRUE(outcome.has_value()) << "the batch in flight was never answered";
  if (*outcome) {
    expect_well_formed(outcome->value(), elements);
    for (const auto& failure : outcome->value().failures) {
      EXPECT_TRUE(failure.error.is(errc::shutting_down)) << failure.error.message();
    }
  } else {
    EXPECT_TRUE(failed_with(*outcome, errc::shutting_down)) << describe(*outcome);
  }
  const auto d = down.wait();
  ASSERT_TRUE(d.has_value()) << "the shutdown was never answered";
  EXPECT_TRUE(*d) << describe(*d);
  EXPECT_EQ(initiator.live_registrations(), 0u);

  auto refused = get_batch(initiator, batch);
  EXPECT_TRUE(failed_with(refused, errc::shutting_down)) << describe(refused);
  auto refused_put = put_batch(initiator, batch);
  EXPECT_TRUE(failed_with(refused_put, errc::shutting_down)) << describe(refused_put);
  EXPECT_EQ(in_flight.calls(), 1);
}

TEST_P(BackendContract, PeerShutdownDuringABatchAnswersItWithinTheBound) {
  constexpr std::size_t slot = 4 * MiB;
  constexpr std::size_t elements = 8;
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), slot * elements, m));
  auto& initiator = *m.pair.initiator.backend;
  auto& target = *m.pair.target.backend;
  // Connected for real first (see PeerShutdownDuringGetsAnswersEveryCaller).
  auto warm = get(initiator, m.element(0, 0, 64));
  ASSERT_TRUE(warm) << describe(warm);
  TransferBatch batch;
  for (std::size_t i = 0; i < elements; ++i) batch.push_back(m.element(i * slot, i * slot, slot));
  // Refused before anything is posted: whatever happens to the others, these
  // keep their own errors (they never reached the provider).
  batch.push_back(m.element(0, 0, 0));
  batch.push_back(m.element(slot * elements - 8, 0, 16));
  const std::size_t refused_from = elements;

  Answer<BatchOutcome> pending;
  Answer<void> target_down;
  const auto limit = GetParam().peer_failure_limit;
  {
    Initiating scope;
    initiator.async_get_batch(batch, pending.handler());
    target.async_shutdown(target_down.handler());
  }
  const auto outcome = pending.wait_until(Clock::now() + limit);
  ASSERT_TRUE(outcome.has_value()) << "the batch was not answered within " << limit.count()
                                   << " ms of its peer shutting down";
  ASSERT_TRUE(*outcome) << describe(*outcome);
  expect_well_formed(outcome->value(), batch.size());
  for (const auto& failure : outcome->value().failures) {
    EXPECT_EQ(failure.error.code.category(), corma::error_category()) << failure.error.message();
  }
  for (std::size_t i = refused_from; i < batch.size(); ++i) {
    const auto failure = failure_of(outcome->value(), i);
    ASSERT_TRUE(failure) << "bad element " << i << " succeeded";
    EXPECT_TRUE(failure->is(errc::out_of_range)) << "element " << i << ": " << failure->message();
  }
  const auto down = target_down.wait();
  ASSERT_TRUE(down.has_value());
  EXPECT_TRUE(*down) << describe(*down);

  // Once the peer is gone, every element of a new batch fails.
  auto after = get_batch(initiator, batch, limit);
  ASSERT_TRUE(after) << describe(after);
  EXPECT_EQ(after.value().failures.size(), batch.size()) << "an element read from a peer that shut down";
  EXPECT_EQ(pending.calls(), 1);
  // The initiator's shutdown releases whatever a dead peer's transfers held.
  auto initiator_down = call<void>([&](auto h) { initiator.async_shutdown(std::move(h)); });
  EXPECT_TRUE(initiator_down) << describe(initiator_down);
  EXPECT_EQ(initiator.live_registrations(), 0u);
}

}  // namespace
}  // namespace corma::contract
