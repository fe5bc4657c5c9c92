// The backend contract (docs/architecture.md, "The backend contract"), checked
// through the RdmaBackend seam alone, for every backend that instantiates
// BackendContract (see backend_contract.hpp). Nothing here may name a
// concrete backend: this file is linked into every instantiation executable.
//
// Synchronisation is by conditions, bounded future waits and command order,
// never by sleeping. Two techniques recur:
// - Blocking the progress thread: an operation completed through a plain
//   callback (no executor bound) runs that callback on the backend's progress
//   thread, so a callback that waits for the test holds every later command
//   in the queue. Whatever the test initiates meanwhile is queued behind it.
// - Cancelling from the test thread: handlers with a cancellation slot are
//   bound to an io_context owned by the test thread and not running while the
//   signal is emitted (Asio slots are single-threaded). That io_context is
//   declared before the backends, so it outlives their threads (which may
//   still be inside a post() to it just after the handler ran).
#include "contract/backend_contract.hpp"
#include "contract/contract_helpers.hpp"

namespace corma::contract {
namespace {

// ===========================================================================
// 1. Transfers move the right bytes.
// ===========================================================================

TEST_P(BackendContract, GetAndPutRoundTripByteForByteAtEverySize) {
  const std::size_t sizes[] = {8, 4 * KiB, 1 * MiB, 64 * MiB};
  auto remote_buffer = OwnedBuffer::allocate(64 * MiB);
  auto local_buffer = OwnedBuffer::allocate(64 * MiB);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto& target = *pair.target.backend;

  std::uint64_t seed = 1;
  for (const std::size_t size : sizes) {
    SCOPED_TRACE(::testing::Message() << size << " bytes");
    fill(remote_buffer.data(), size, seed++);
    fill(local_buffer.data(), size, seed++);
    ASSERT_FALSE(same_bytes(remote_buffer.data(), local_buffer.data(), size));

    auto remote = map(target, remote_buffer.data(), size, Access::remote_read_write);
    ASSERT_TRUE(remote) << describe(remote);
    auto local = map(initiator, local_buffer.data(), size, Access::local);
    ASSERT_TRUE(local) << describe(local);
    expect_covers(remote.value(), remote_buffer.data(), size, Access::remote_read_write);
    expect_covers(local.value(), local_buffer.data(), size, Access::local);
    EXPECT_EQ(target.live_registrations(), 1u);
    EXPECT_EQ(initiator.live_registrations(), 1u);

    GetRequest get_request{pair.peer, local.value().id, 0, address(remote_buffer.data()), size,
                           remote.value().packed_key};
    auto got = get(initiator, std::move(get_request));
    ASSERT_TRUE(got) << describe(got);
    EXPECT_TRUE(same_bytes(local_buffer.data(), remote_buffer.data(), size)) << "get moved the wrong bytes";

    fill(local_buffer.data(), size, seed++);
    ASSERT_FALSE(same_bytes(remote_buffer.data(), local_buffer.data(), size));
    PutRequest put_request{pair.peer, local.value().id, 0, address(remote_buffer.data()), size,
                           remote.value().packed_key};
    auto written = put(initiator, std::move(put_request));
    ASSERT_TRUE(written) << describe(written);
    EXPECT_TRUE(same_bytes(local_buffer.data(), remote_buffer.data(), size)) << "put moved the wrong bytes";

    auto local_unmapped = unmap(initiator, local.value().id);
    EXPECT_TRUE(local_unmapped) << describe(local_unmapped);
    auto remote_unmapped = unmap(target, remote.value().id);
    EXPECT_TRUE(remote_unmapped) << describe(remote_unmapped);
    EXPECT_EQ(initiator.live_registrations(), 0u);
    EXPECT_EQ(target.live_registrations(), 0u);
  }
}

TEST_P(BackendContract, TransfersAtNonZeroOffsetsTouchExactlyTheirSlice) {
  constexpr std::size_t region_len = 64 * KiB;
  auto remote_buffer = OwnedBuffer::allocate(region_len);
  auto local_buffer = OwnedBuffer::allocate(region_len);
  std::byte* const remote_bytes = remote_buffer.data();
  std::byte* const local_bytes = local_buffer.data();
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto& target = *pair.target.backend;
  auto remote = map(target, remote_bytes, region_len, Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_bytes, region_len, Access::local);
  ASSERT_TRUE(local) << describe(local);

  struct Case {
    std::uint64_t local_offset;
    std::uint64_t remote_offset;
    std::uint64_t len;
  };
  const Case cases[] = {
      {1, 3, 1},           {123, 4567, 10000},        {4096, 0, 8192},
      {0, 8191, 4097},     {region_len - 1, region_len - 1, 1},
      {region_len - 100, 7, 100},                     {8, 0, region_len - 8},
  };
  std::uint64_t seed = 100;
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "local_offset " << c.local_offset << ", remote_offset "
                                      << c.remote_offset << ", len " << c.len);
    fill(remote_bytes, region_len, seed++);
    fill(local_bytes, region_len, seed++);
    const auto local_before = copy_of(local_bytes, region_len);
    GetRequest get_request{pair.peer, local.value().id, c.local_offset, address(remote_bytes) + c.remote_offset,
                           c.len, remote.value().packed_key};
    auto got = get(initiator, std::move(get_request));
    ASSERT_TRUE(got) << describe(got);
    expect_only_slice_written(local_bytes, local_before, c.local_offset, remote_bytes + c.remote_offset, c.len,
                              region_len);

    fill(local_bytes, region_len, seed++);
    const auto remote_before = copy_of(remote_bytes, region_len);
    PutRequest put_request{pair.peer, local.value().id, c.local_offset, address(remote_bytes) + c.remote_offset,
                           c.len, remote.value().packed_key};
    auto written = put(initiator, std::move(put_request));
    ASSERT_TRUE(written) << describe(written);
    expect_only_slice_written(remote_bytes, remote_before, c.remote_offset, local_bytes + c.local_offset, c.len,
                              region_len);
  }
  EXPECT_TRUE(unmap(initiator, local.value().id));
  EXPECT_TRUE(unmap(target, remote.value().id));
}

// ===========================================================================
// 2-4. A cancelled map leaves nothing behind.
// ===========================================================================

TEST_P(BackendContract, MapCancelledBeforeItRunsLeavesNothingBehind) {
  // Declared first: outlives the backend, whose thread posts into it.
  asio::io_context io;
  auto buffer = OwnedBuffer::allocate(64 * KiB);
  auto subject = GetParam().make();
  auto& backend = *subject.backend;
  for (const auto type : all_cancellation_types) {
    SCOPED_TRACE(::testing::Message() << "cancellation_type " << static_cast<int>(type));
    asio::cancellation_signal signal;
    std::optional<Result<BackendRegion>> outcome;
    int calls = 0;
    {
      ProgressBlocker blocker(backend);
      ASSERT_TRUE(blocker.blocked()) << "the progress thread never ran the blocking callback";
      backend.async_map(buffer.data(), buffer.size(), Access::remote_read,
                        asio::bind_cancellation_slot(
                            signal.slot(), asio::bind_executor(io, [&](Result<BackendRegion> r) {
                              ++calls;
                              outcome = std::move(r);
                            })));
      signal.emit(type);  // io is not running: the slot is ours alone
      blocker.release();
    }
    ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the cancelled map was never answered";
    EXPECT_TRUE(failed_with(*outcome, errc::cancelled)) << describe(*outcome);
    EXPECT_EQ(backend.live_registrations(), 0u) << "a cancelled map left a registration behind";
    drain(io);
    EXPECT_EQ(calls, 1);
    if (*outcome) (void)unmap(backend, outcome->value().id);
  }
}

TEST_P(BackendContract, MapCancelledAfterItMappedIsRolledBack) {
  // Declared first: outlives the backend, whose thread posts into it.
  asio::io_context io;
  auto buffer = OwnedBuffer::allocate(64 * KiB);
  auto subject = GetParam().make();
  if (!subject.set_map_delay) GTEST_SKIP() << "the subject cannot delay map answers (set_map_delay)";
  auto& backend = *subject.backend;
  // Long enough that only the cancellation can end the wait.
  subject.set_map_delay(std::chrono::seconds(30));
  for (const auto type : all_cancellation_types) {
    SCOPED_TRACE(::testing::Message() << "cancellation_type " << static_cast<int>(type));
    asio::cancellation_signal signal;
    std::optional<Result<BackendRegion>> outcome;
    int calls = 0;
    backend.async_map(buffer.data(), buffer.size(), Access::remote_read,
                      asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<BackendRegion> r) {
                                                     ++calls;
                                                     outcome = std::move(r);
                                                   })));
    ASSERT_TRUE(eventually([&] { return backend.live_registrations() == 1u; }))
        << "the map never reached the provider";
    EXPECT_FALSE(outcome.has_value());
    signal.emit(type);
    ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the cancelled map was never answered";
    EXPECT_TRUE(failed_with(*outcome, errc::cancelled)) << describe(*outcome);
    EXPECT_EQ(backend.live_registrations(), 0u) << "the registration was not rolled back before the answer";
    drain(io);
    EXPECT_EQ(calls, 1);
    if (*outcome) (void)unmap(backend, outcome->value().id);
  }
  subject.set_map_delay(std::chrono::nanoseconds(0));
}

TEST_P(BackendContract, MapWhoseHandlerIsDestroyedUndeliveredIsRolledBack) {
  auto buffer = OwnedBuffer::allocate(64 * KiB);
  auto subject = GetParam().make();
  if (!subject.maps_handed_off) {
    GTEST_SKIP() << "the subject cannot tell when a map result was handed to its executor (maps_handed_off)";
  }
  auto& backend = *subject.backend;
  auto ran = std::make_shared<std::atomic<bool>>(false);
  const std::size_t handed_off_before = subject.maps_handed_off();
  {
    asio::io_context never_run;
    backend.async_map(buffer.data(), buffer.size(), Access::remote_read,
                      asio::bind_executor(never_run, [ran](Result<BackendRegion>) { ran->store(true); }));
    ASSERT_TRUE(eventually([&] { return subject.maps_handed_off() > handed_off_before; }))
        << "the map result never reached the handler's executor";
    EXPECT_EQ(backend.live_registrations(), 1u) << "mapped, the answer waiting in an io_context nobody runs";
  }  // destroying the io_context destroys the undelivered handler
  EXPECT_TRUE(eventually([&] { return backend.live_registrations() == 0u; }))
      << "a map whose answer was never delivered was not rolled back";
  EXPECT_FALSE(ran->load());
}

// ===========================================================================
// 5. Unmap is idempotent and proceeds once submitted.
// ===========================================================================

TEST_P(BackendContract, UnmapIsIdempotent) {
  auto buffer = OwnedBuffer::allocate(64 * KiB);
  auto subject = GetParam().make();
  auto& backend = *subject.backend;

  auto unknown = unmap(backend, RegionId{0x7fff'ffff'ffff'fff1ULL});
  EXPECT_TRUE(unknown) << "unknown id: " << describe(unknown);

  auto region = map(backend, buffer.data(), buffer.size(), Access::remote_read);
  ASSERT_TRUE(region) << describe(region);
  EXPECT_EQ(backend.live_registrations(), 1u);
  auto first = unmap(backend, region.value().id);
  EXPECT_TRUE(first) << describe(first);
  EXPECT_EQ(backend.live_registrations(), 0u) << "success from unmap means no longer registered";
  auto second = unmap(backend, region.value().id);
  EXPECT_TRUE(second) << "second unmap: " << describe(second);
  EXPECT_EQ(backend.live_registrations(), 0u);

  // Two unmaps of one region in flight at once: both answer success.
  auto again = map(backend, buffer.data(), buffer.size(), Access::remote_read);
  ASSERT_TRUE(again) << describe(again);
  Answer<void> a;
  Answer<void> b;
  {
    Initiating scope;
    backend.async_unmap(again.value().id, a.handler());
    backend.async_unmap(again.value().id, b.handler());
  }
  const auto ra = a.wait();
  const auto rb = b.wait();
  ASSERT_TRUE(ra && rb) << describe(ra) << " / " << describe(rb);
  EXPECT_TRUE(*ra) << describe(*ra);
  EXPECT_TRUE(*rb) << describe(*rb);
  EXPECT_EQ(backend.live_registrations(), 0u);
  EXPECT_EQ(a.calls(), 1);
  EXPECT_EQ(b.calls(), 1);
}

TEST_P(BackendContract, CancelledUnmapAbandonsOnlyTheNotification) {
  // Declared first: outlives the backend, whose thread posts into it.
  asio::io_context io;
  auto buffer = OwnedBuffer::allocate(64 * KiB);
  auto subject = GetParam().make();
  auto& backend = *subject.backend;
  // Cancelled right after initiation, then cancelled before the command ran.
  for (const bool hold_progress : {false, true}) {
    SCOPED_TRACE(hold_progress ? "cancelled before the unmap ran" : "cancelled right after initiation");
    auto region = map(backend, buffer.data(), buffer.size(), Access::remote_read);
    ASSERT_TRUE(region) << describe(region);
    asio::cancellation_signal signal;
    std::optional<Result<void>> outcome;
    int calls = 0;
    {
      std::optional<ProgressBlocker> blocker;
      if (hold_progress) {
        blocker.emplace(backend);
        ASSERT_TRUE(blocker->blocked()) << "the progress thread never ran the blocking callback";
      }
      backend.async_unmap(region.value().id,
                          asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<void> r) {
                                                         ++calls;
                                                         outcome = r;
                                                       })));
      signal.emit(asio::cancellation_type::terminal);
    }
    ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the cancelled unmap was never answered";
    EXPECT_TRUE(*outcome || failed_with(*outcome, errc::cancelled)) << describe(*outcome);
    // Whatever the answer, the unmap itself went ahead.
    EXPECT_TRUE(eventually([&] { return backend.live_registrations() == 0u; }))
        << "a cancelled unmap did not proceed";
    auto retry = unmap(backend, region.value().id);
    EXPECT_TRUE(retry) << describe(retry);
    drain(io);
    EXPECT_EQ(calls, 1);
  }
}

// ===========================================================================
// 6. Unmap waits for transfers in flight; new transfers are refused.
// ===========================================================================

TEST_P(BackendContract, UnmapWaitsForTransfersInFlightAndRefusesNewOnes) {
  constexpr std::size_t chunk = 8 * MiB;
  constexpr int transfers = 4;
  constexpr std::size_t total = chunk * transfers;
  auto remote_buffer = OwnedBuffer::allocate(total);
  auto local_buffer = OwnedBuffer::allocate(total);
  fill(remote_buffer.data(), total, 11);
  fill(local_buffer.data(), total, 12);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  if (pair.initiator.set_transfer_delay) pair.initiator.set_transfer_delay(50ms);  // really in flight
  auto remote = map(*pair.target.backend, remote_buffer.data(), total, Access::remote_read);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), total, Access::local);
  ASSERT_TRUE(local) << describe(local);

  auto completed = std::make_shared<std::atomic<int>>(0);
  auto seen_by_unmap = std::make_shared<std::atomic<int>>(-1);
  std::vector<Answer<void>> pending_gets(transfers);
  Answer<void> unmapped;
  Answer<void> late;
  {
    Initiating scope;
    for (int i = 0; i < transfers; ++i) {
      const std::uint64_t offset = static_cast<std::uint64_t>(i) * chunk;
      GetRequest request{pair.peer, local.value().id, offset, address(remote_buffer.data()) + offset, chunk,
                         remote.value().packed_key};
      initiator.async_get(std::move(request), [completed, h = pending_gets[i].handler()](Result<void> r) {
        completed->fetch_add(1);
        h(std::move(r));
      });
    }
    initiator.async_unmap(local.value().id, [completed, seen_by_unmap, h = unmapped.handler()](Result<void> r) {
      seen_by_unmap->store(completed->load());
      h(std::move(r));
    });
    GetRequest after_unmap{pair.peer, local.value().id, 0, address(remote_buffer.data()), chunk,
                           remote.value().packed_key};
    initiator.async_get(std::move(after_unmap), late.handler());
  }
  for (int i = 0; i < transfers; ++i) {
    const auto r = pending_gets[i].wait();
    ASSERT_TRUE(r.has_value()) << "get " << i << " was never answered";
    EXPECT_TRUE(*r) << "get " << i << ": " << describe(*r);
  }
  const auto u = unmapped.wait();
  ASSERT_TRUE(u.has_value()) << "the unmap was never answered";
  EXPECT_TRUE(*u) << describe(*u);
  EXPECT_EQ(seen_by_unmap->load(), transfers) << "the unmap was answered before every transfer into the region ended";
  const auto l = late.wait();
  ASSERT_TRUE(l.has_value()) << "the get issued after the unmap was never answered";
  EXPECT_TRUE(failed_with(*l, errc::region_not_found)) << describe(*l);
  EXPECT_TRUE(same_bytes(local_buffer.data(), remote_buffer.data(), total)) << "a transfer was cut short";
  EXPECT_EQ(initiator.live_registrations(), 0u);
  for (const auto& g : pending_gets) EXPECT_EQ(g.calls(), 1);
  EXPECT_EQ(unmapped.calls(), 1);
  EXPECT_EQ(late.calls(), 1);
}

// ===========================================================================
// 7. A cancelled transfer answers early; its region outlives it.
// ===========================================================================

TEST_P(BackendContract, CancelledGetAnswersEarlyAndTheRegionOutlivesTheTransfer) {
  constexpr std::size_t size = 64 * MiB;
  // Declared first: outlives the backends, whose threads post into it.
  asio::io_context io;
  auto remote_buffer = OwnedBuffer::allocate(size);
  fill(remote_buffer.data(), size, 21);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  // With a transfer delay the cancellation is sure to find the transfer
  // still running when the progress thread was held (below).
  const bool widened = static_cast<bool>(pair.initiator.set_transfer_delay);
  if (widened) pair.initiator.set_transfer_delay(200ms);
  auto remote = map(*pair.target.backend, remote_buffer.data(), size, Access::remote_read);
  ASSERT_TRUE(remote) << describe(remote);

  for (const bool hold_progress : {false, true}) {
    SCOPED_TRACE(hold_progress ? "cancelled before the get ran" : "cancelled right after initiation");
    // Freed as soon as the unmap succeeds: a provider still writing into it
    // afterwards is a use after free (ASan).
    auto local_buffer = std::make_unique<OwnedBuffer>(OwnedBuffer::allocate(size));
    auto local = map(initiator, local_buffer->data(), size, Access::local);
    ASSERT_TRUE(local) << describe(local);
    asio::cancellation_signal signal;
    std::optional<Result<void>> got;
    int calls = 0;
    Answer<void> unmapped;
    {
      std::optional<ProgressBlocker> blocker;
      if (hold_progress) {
        blocker.emplace(initiator);
        ASSERT_TRUE(blocker->blocked()) << "the progress thread never ran the blocking callback";
      }
      GetRequest request{pair.peer, local.value().id, 0, address(remote_buffer.data()), size,
                         remote.value().packed_key};
      initiator.async_get(std::move(request),
                          asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<void> r) {
                                                         ++calls;
                                                         got = r;
                                                       })));
      signal.emit(asio::cancellation_type::terminal);
      Initiating scope;
      initiator.async_unmap(local.value().id, unmapped.handler());
    }
    ASSERT_TRUE(run_until(io, [&] { return got.has_value(); })) << "the cancelled get was never answered";
    EXPECT_TRUE(*got || failed_with(*got, errc::cancelled)) << describe(*got);
    if (widened && hold_progress) {
      EXPECT_TRUE(failed_with(*got, errc::cancelled))
          << "cancelled while the transfer was held in flight, yet answered: " << describe(*got);
    }
    const auto u = unmapped.wait();
    ASSERT_TRUE(u.has_value()) << "the unmap was never answered";
    EXPECT_TRUE(*u) << describe(*u);
    EXPECT_EQ(initiator.live_registrations(), 0u);
    if (pair.initiator.transfers_in_flight) {
      EXPECT_EQ(pair.initiator.transfers_in_flight(), 0u)
          << "the unmap was answered while the transfer into the region still ran";
    }
    local_buffer.reset();
    drain(io);
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(unmapped.calls(), 1);
  }
  auto remote_unmapped = unmap(*pair.target.backend, remote.value().id);
  EXPECT_TRUE(remote_unmapped) << describe(remote_unmapped);
}

/// Names a cancellation type in test traces.
const char* name_of(asio::cancellation_type type) {
  switch (type) {
    case asio::cancellation_type::terminal: return "terminal";
    case asio::cancellation_type::partial: return "partial";
    case asio::cancellation_type::total: return "total";
    default: return "mixed";
  }
}

/// Two connected backends with a `size`-byte buffer each, the target's
/// mapped for peers; the initiator's transfers take `delay` more where the
/// subject can say so.
struct Transfers {
  OwnedBuffer remote_buffer;
  OwnedBuffer local_buffer;
  Pair pair;
  BackendRegion remote;
};

void set_up(const ContractParam& param, std::size_t size, std::chrono::milliseconds delay, Transfers& t) {
  t.remote_buffer = OwnedBuffer::allocate(size);
  t.local_buffer = OwnedBuffer::allocate(size);
  ASSERT_NO_FATAL_FAILURE(connect(param, t.pair));
  if (t.pair.initiator.set_transfer_delay) t.pair.initiator.set_transfer_delay(delay);
  auto remote = map(*t.pair.target.backend, t.remote_buffer.data(), size, Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  t.remote = std::move(remote).value();
}

TEST_P(BackendContract, PartialOrTotalCancellationLeavesATransferToItsRealResult) {
  constexpr std::size_t size = 1 * MiB;
  // Declared first: outlives the backends, whose threads post into it.
  asio::io_context io;
  Transfers t;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), size, 20ms, t));  // still running at the signal
  auto& [remote_buffer, local_buffer, pair, remote] = t;
  auto& initiator = *pair.initiator.backend;
  Registry registry(pair.initiator.backend, RegistryConfig{.budget_bytes = 2 * size});
  auto guard = registry.async_register(local_buffer.bytes(), Access::local, asio::use_future).get();
  ASSERT_TRUE(guard) << describe(guard);
  const RemoteRegion remote_region{initiator.wire_id(), 1, address(remote_buffer.data()), size,
                                   remote.packed_key};

  // Neither allows a `cancelled` answer while the bytes may still land, so
  // the transfer runs on, through the seam and through a RegionGuard alike.
  std::uint64_t seed = 71;
  for (const auto type : {asio::cancellation_type::partial, asio::cancellation_type::total}) {
    for (const bool through_guard : {false, true}) {
      for (const bool is_put : {false, true}) {
        for (const bool hold_progress : {false, true}) {
          SCOPED_TRACE(::testing::Message() << name_of(type) << (is_put ? " put" : " get")
                                            << (through_guard ? " through a guard" : " through the seam")
                                            << (hold_progress ? ", before it ran" : ", in flight"));
          fill(remote_buffer.data(), size, seed++);
          fill(local_buffer.data(), size, seed++);
          const auto expected = copy_of(is_put ? local_buffer.data() : remote_buffer.data(), size);
          asio::cancellation_signal signal;
          std::optional<Result<void>> outcome;
          int calls = 0;
          auto handler = asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<void> r) {
                                                        ++calls;
                                                        outcome = r;
                                                      }));
          {
            std::optional<ProgressBlocker> blocker;
            if (hold_progress) {
              blocker.emplace(initiator);
              ASSERT_TRUE(blocker->blocked()) << "the progress thread never ran the blocking callback";
            }
            if (through_guard) {
              const TransferRange range{0, 0, size};
              if (is_put) {
                guard.value().async_put(pair.peer, remote_region, range, std::move(handler));
              } else {
                guard.value().async_get(pair.peer, remote_region, range, std::move(handler));
              }
            } else {
              TransferRequest request{pair.peer, guard.value().id(), 0, address(remote_buffer.data()), size,
                                      remote.packed_key};
              if (is_put) {
                initiator.async_put(std::move(request), std::move(handler));
              } else {
                initiator.async_get(std::move(request), std::move(handler));
              }
            }
            signal.emit(type);  // io is not running: the slot is ours alone
          }
          ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the transfer was never answered";
          EXPECT_TRUE(*outcome) << describe(*outcome);
          EXPECT_TRUE(same_bytes(is_put ? remote_buffer.data() : local_buffer.data(), expected.data(), size))
              << "the transfer did not run to its end";
          drain(io);
          EXPECT_EQ(calls, 1);
        }
      }
    }
  }
}

TEST_P(BackendContract, PartialOrTotalCancellationLeavesAnUnmapToItsRealResult) {
  constexpr std::size_t size = 16 * MiB;
  // Declared first: outlives the backends, whose threads post into it.
  asio::io_context io;
  Transfers t;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), size, 50ms, t));  // the unmap surely waits
  auto& [remote_buffer, local_buffer, pair, remote] = t;
  auto& initiator = *pair.initiator.backend;
  // An unmap goes ahead once submitted, so only a terminal cancellation may
  // answer it early: here it waits for a transfer when the signal comes.
  for (const auto type : {asio::cancellation_type::partial, asio::cancellation_type::total}) {
    SCOPED_TRACE(name_of(type));
    auto local = map(initiator, local_buffer.data(), size, Access::local);
    ASSERT_TRUE(local) << describe(local);
    Answer<void> got;
    asio::cancellation_signal signal;
    std::optional<Result<void>> outcome;
    int calls = 0;
    {
      ProgressBlocker blocker(initiator);
      ASSERT_TRUE(blocker.blocked()) << "the progress thread never ran the blocking callback";
      initiator.async_get({pair.peer, local.value().id, 0, address(remote_buffer.data()), size,
                           remote.packed_key},
                          got.handler());
      initiator.async_unmap(local.value().id,
                            asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<void> r) {
                                                           ++calls;
                                                           outcome = r;
                                                         })));
      signal.emit(type);  // io is not running: the slot is ours alone
    }
    ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the unmap was never answered";
    EXPECT_TRUE(*outcome) << describe(*outcome);
    const auto g = got.wait();
    ASSERT_TRUE(g.has_value()) << "the get was never answered";
    EXPECT_TRUE(*g) << describe(*g);
    EXPECT_EQ(initiator.live_registrations(), 0u) << "success from unmap means no longer registered";
    drain(io);
    EXPECT_EQ(calls, 1);
  }
}

// ===========================================================================
// 8. Every request is validated before it reaches the provider.
// ===========================================================================

class Validation {
 public:
  static constexpr std::size_t region_len = 64 * KiB;

  void set_up(const ContractParam& param) {
    fill(remote_bytes(), region_len, 31);
    fill(local_bytes(), region_len, 32);
    ASSERT_NO_FATAL_FAILURE(connect(param, pair));
    auto r = map(*pair.target.backend, remote_bytes(), region_len, Access::remote_read_write);
    ASSERT_TRUE(r) << describe(r);
    remote = r.value();
    auto l = map(*pair.initiator.backend, local_bytes(), region_len, Access::local);
    ASSERT_TRUE(l) << describe(l);
    local = l.value();
    remote_before = copy_of(remote_bytes(), region_len);
    local_before = copy_of(local_bytes(), region_len);
    good = GetRequest{pair.peer, local.id, 0, address(remote_bytes()), 64, remote.packed_key};
  }

  /// Both a get and a put with `request` fail; with `code` when given.
  void expect_refused(const TransferRequest& request, const std::string& what,
                      std::optional<errc> code = std::nullopt) {
    auto& initiator = *pair.initiator.backend;
    auto g = get(initiator, request);
    auto p = put(initiator, request);
    if (code) {
      EXPECT_TRUE(failed_with(g, *code)) << what << " (get): " << describe(g);
      EXPECT_TRUE(failed_with(p, *code)) << what << " (put): " << describe(p);
    } else {
      EXPECT_TRUE(is_corma_error(g)) << what << " (get): " << describe(g);
      EXPECT_TRUE(is_corma_error(p)) << what << " (put): " << describe(p);
    }
  }

  /// Nothing a refused request carried moved a byte.
  void expect_untouched() {
    EXPECT_TRUE(same_bytes(remote_bytes(), remote_before.data(), region_len)) << "a refused put wrote";
    EXPECT_TRUE(same_bytes(local_bytes(), local_before.data(), region_len)) << "a refused get wrote";
  }

  std::byte* remote_bytes() const { return remote_buffer.data(); }
  std::byte* local_bytes() const { return local_buffer.data(); }

  // Declared first: outlive the backends.
  OwnedBuffer remote_buffer = OwnedBuffer::allocate(region_len);
  OwnedBuffer local_buffer = OwnedBuffer::allocate(region_len);
  Pair pair;
  BackendRegion remote;
  BackendRegion local;
  std::vector<std::byte> remote_before;
  std::vector<std::byte> local_before;
  GetRequest good;
};

TEST_P(BackendContract, BadRangesRegionsAndPeersAreRefusedBeforeTheProvider) {
  Validation v;
  ASSERT_NO_FATAL_FAILURE(v.set_up(GetParam()));
  auto& initiator = *v.pair.initiator.backend;
  constexpr std::uint64_t n = Validation::region_len;

  auto r = v.good;
  r.len = 0;
  v.expect_refused(r, "zero length", errc::out_of_range);
  r = v.good;
  r.local_offset = n - 63;  // one byte past the end
  v.expect_refused(r, "slice past the local region", errc::out_of_range);
  r = v.good;
  r.local_offset = n;
  r.len = 1;
  v.expect_refused(r, "offset at the end of the local region", errc::out_of_range);
  r = v.good;
  r.len = n + 1;
  v.expect_refused(r, "longer than the local region", errc::out_of_range);
  r = v.good;
  r.local_offset = u64_max - 10;
  v.expect_refused(r, "offset + len overflows", errc::out_of_range);
  r = v.good;
  r.local_offset = 8;
  r.len = u64_max - 4;
  v.expect_refused(r, "len near UINT64_MAX overflows", errc::out_of_range);
  r = v.good;
  r.len = u64_max;
  v.expect_refused(r, "len UINT64_MAX", errc::out_of_range);
  r = v.good;
  r.local = RegionId{0x7fff'ffff'ffff'fff1ULL};
  v.expect_refused(r, "unknown local region", errc::region_not_found);
  r = v.good;
  r.peer = PeerId{0x7fff'ffff'ffff'fff1ULL};
  v.expect_refused(r, "unknown peer", errc::peer_unreachable);

  // A region that was registered and no longer is.
  auto spare = OwnedBuffer::allocate(4 * KiB);
  auto gone = map(initiator, spare.data(), spare.size(), Access::local);
  ASSERT_TRUE(gone) << describe(gone);
  ASSERT_TRUE(unmap(initiator, gone.value().id));
  r = v.good;
  r.local = gone.value().id;
  v.expect_refused(r, "unmapped local region", errc::region_not_found);

  // Maps: null, empty, wrapping around the address space.
  EXPECT_TRUE(failed_with(map(initiator, nullptr, 4096, Access::local), errc::out_of_range)) << "null pointer";
  EXPECT_TRUE(failed_with(map(initiator, spare.data(), 0, Access::local), errc::out_of_range)) << "zero length";
  // Never dereferenced: refused before anything looks at it.
  void* near_top = reinterpret_cast<void*>(std::numeric_limits<std::uintptr_t>::max() - 2047);
  EXPECT_TRUE(failed_with(map(initiator, near_top, 4096, Access::local), errc::out_of_range)) << "wrapping range";
  EXPECT_EQ(initiator.live_registrations(), 1u) << "a refused map registered something";

  v.expect_untouched();
  // The backend is unharmed: the good request still works.
  auto fine = get(initiator, v.good);
  EXPECT_TRUE(fine) << describe(fine);
}

TEST_P(BackendContract, MalformedPackedKeysAndRemoteRangesAreRefused) {
  Validation v;
  ASSERT_NO_FATAL_FAILURE(v.set_up(GetParam()));
  auto& initiator = *v.pair.initiator.backend;
  const PackedKey& real = v.remote.packed_key;
  ASSERT_FALSE(real.empty());
  auto with_key = [&](PackedKey key) {
    auto r = v.good;
    r.key = std::move(key);
    return r;
  };

  v.expect_refused(with_key({}), "empty key", errc::invalid_key);
  PackedKey oversized = real;
  oversized.resize(max_packed_key_size + 1, std::byte{0x5A});
  v.expect_refused(with_key(oversized), "oversized key", errc::invalid_key);
  v.expect_refused(with_key(PackedKey(real.begin(), real.begin() + static_cast<std::ptrdiff_t>(real.size() / 2))),
                   "truncated key (first half)");
  PackedKey one_short(real.begin(), real.end() - 1);
  v.expect_refused(with_key(one_short), "truncated key (one byte short)");
  PackedKey one_long = real;
  one_long.push_back(std::byte{0});
  v.expect_refused(with_key(one_long), "key with a byte appended");
  std::mt19937_64 random(0xC0FFEE);
  PackedKey noise(64);
  for (auto& b : noise) b = static_cast<std::byte>(random());
  v.expect_refused(with_key(noise), "64 random bytes");
  for (std::size_t i = 0; i < real.size(); ++i) {
    PackedKey flipped = real;
    flipped[i] ^= std::byte{0xFF};
    v.expect_refused(with_key(flipped), "key with byte " + std::to_string(i) + " flipped");
  }
  // A key the initiator packed itself, for memory it never exported.
  v.expect_refused(with_key(v.local.packed_key), "key of the initiator's own local region");

  // Remote addresses outside the key's range.
  const std::uint64_t base = address(v.remote_bytes());
  constexpr std::uint64_t n = Validation::region_len;
  auto r = v.good;
  r.remote_addr = base + n - 8;  // runs 56 bytes past the end
  v.expect_refused(r, "remote slice past the end");
  r.remote_addr = base + n;
  v.expect_refused(r, "remote address at the end");
  r.remote_addr = base - 64;
  v.expect_refused(r, "remote address below the range");
  r.remote_addr = u64_max - 10;
  v.expect_refused(r, "remote address + len overflows");
  r = v.good;
  r.len = n;
  r.remote_addr = base + 1;
  v.expect_refused(r, "remote slice one byte past the end");

  v.expect_untouched();
  auto fine = get(initiator, v.good);
  EXPECT_TRUE(fine) << describe(fine);
  EXPECT_TRUE(same_bytes(v.local_bytes(), v.remote_bytes(), 64));
}

// ===========================================================================
// 9. A peer that goes away answers its callers' transfers.
// ===========================================================================

TEST_P(BackendContract, PeerShutdownDuringGetsAnswersEveryCaller) {
  constexpr std::size_t size = 64 * MiB;
  constexpr int transfers = 4;
  auto remote_buffer = OwnedBuffer::allocate(size);
  auto local_buffer = OwnedBuffer::allocate(size);
  fill(remote_buffer.data(), size, 41);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto& target = *pair.target.backend;
  auto remote = map(target, remote_buffer.data(), size, Access::remote_read);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), size, Access::local);
  ASSERT_TRUE(local) << describe(local);
  const GetRequest request{pair.peer, local.value().id, 0, address(remote_buffer.data()), size,
                           remote.value().packed_key};
  // The connection is fully established first (one small get round trip):
  // what is under test is a peer leaving mid-transfer, not mid-handshake
  // (UCX 1.13 aborts the process on some shutdowns during its wire-up).
  auto first = request;
  first.len = 64;
  auto warm = get(initiator, first);
  ASSERT_TRUE(warm) << describe(warm);

  std::vector<Answer<void>> pending_gets(transfers);
  Answer<void> target_down;
  const auto limit = GetParam().peer_failure_limit;
  {
    Initiating scope;
    for (auto& g : pending_gets) initiator.async_get(request, g.handler());
    target.async_shutdown(target_down.handler());
  }
  const auto deadline = Clock::now() + limit;
  for (int i = 0; i < transfers; ++i) {
    const auto r = pending_gets[i].wait_until(deadline);
    ASSERT_TRUE(r.has_value()) << "get " << i << " was not answered within " << limit.count()
                               << " ms of its peer shutting down";
    EXPECT_TRUE(*r || is_corma_error(*r)) << describe(*r);
  }
  const auto down = target_down.wait();
  ASSERT_TRUE(down.has_value()) << "the target's shutdown was never answered";
  EXPECT_TRUE(*down) << describe(*down);
  EXPECT_EQ(target.live_registrations(), 0u);

  // Once the peer is gone, a new get fails (never reads deregistered memory)
  // within the same bound.
  auto after = get(initiator, request, limit);
  EXPECT_TRUE(is_corma_error(after)) << "get from a peer that shut down: " << describe(after);

  // The local region comes back once its transfers really end: at once where
  // the provider ends a dead peer's transfers; where it cannot, only when
  // the initiator shuts down. It is never released under a pending transfer.
  Answer<void> unmapped;
  {
    Initiating scope;
    initiator.async_unmap(local.value().id, unmapped.handler());
  }
  if (!GetParam().ends_dead_peer_transfers) {
    // Commands run in order: once a later one is answered, the unmap ran.
    auto refused = get(initiator, request);
    EXPECT_TRUE(failed_with(refused, errc::region_not_found)) << describe(refused);
    EXPECT_FALSE(unmapped.wait(std::chrono::milliseconds(0)).has_value())
        << "released under transfers the provider still holds: " << describe(unmapped.wait());
    EXPECT_EQ(initiator.live_registrations(), 1u);
    auto initiator_down = call<void>([&](auto h) { initiator.async_shutdown(std::move(h)); });
    EXPECT_TRUE(initiator_down) << describe(initiator_down);
  }
  const auto u = unmapped.wait();
  ASSERT_TRUE(u.has_value()) << "the unmap was never answered";
  EXPECT_TRUE(*u) << describe(*u);
  EXPECT_EQ(initiator.live_registrations(), 0u);
  EXPECT_EQ(unmapped.calls(), 1);
  for (const auto& g : pending_gets) EXPECT_EQ(g.calls(), 1);
}

// ===========================================================================
// 10. Shutdown answers every caller exactly once.
// ===========================================================================

/// Counts the answers of many operations, one slot each.
class Tally : public std::enable_shared_from_this<Tally> {
 public:
  explicit Tally(std::size_t n) : calls_(n, 0), codes_(n) {}

  template <class T>
  auto handler(std::size_t i) {
    return [self = shared_from_this(), i](Result<T> r) {
      std::lock_guard lock(self->mutex_);
      ++self->calls_[i];
      ++self->total_;
      self->codes_[i] = r ? std::error_code{} : r.error().code;
      self->changed_.notify_all();
    };
  }
  bool wait_for_total(int n, std::chrono::milliseconds limit = answer_limit) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return total_ >= n; });
  }
  int total() const {
    std::lock_guard lock(mutex_);
    return total_;
  }
  int calls(std::size_t i) const {
    std::lock_guard lock(mutex_);
    return calls_[i];
  }
  std::error_code code(std::size_t i) const {
    std::lock_guard lock(mutex_);
    return codes_[i];
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int> calls_;
  std::vector<std::error_code> codes_;
  int total_ = 0;
};

TEST_P(BackendContract, ShutdownWithOperationsInFlightAnswersEveryCallerOnce) {
  constexpr std::size_t page = 4 * KiB;
  constexpr std::size_t operations = 100;
  constexpr std::size_t maps = 40;
  constexpr std::size_t unmaps = 30;
  constexpr std::size_t transfers = 30;
  constexpr std::size_t get_len = 32 * KiB;
  static_assert(maps + unmaps + transfers == operations);
  auto map_buffer = OwnedBuffer::allocate((maps + unmaps) * page);
  auto remote_buffer = OwnedBuffer::allocate(transfers * get_len);
  auto local_buffer = OwnedBuffer::allocate(transfers * get_len);
  fill(remote_buffer.data(), remote_buffer.size(), 51);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto remote = map(*pair.target.backend, remote_buffer.data(), remote_buffer.size(), Access::remote_read);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);
  std::vector<RegionId> premapped;
  for (std::size_t k = 0; k < unmaps; ++k) {
    auto region = map(initiator, map_buffer.data() + (maps + k) * page, page, Access::remote_read);
    ASSERT_TRUE(region) << describe(region);
    premapped.push_back(region.value().id);
  }
  ASSERT_EQ(initiator.live_registrations(), 1 + unmaps);

  enum class Kind { map, get, unmap };
  std::vector<Kind> kinds;
  auto tally = std::make_shared<Tally>(operations);
  Answer<void> down;
  {
    Initiating scope;
    std::size_t next_map = 0;
    std::size_t next_get = 0;
    std::size_t next_unmap = 0;
    for (std::size_t i = 0; i < operations; ++i) {
      const std::size_t phase = i % 10;  // 4 maps, 3 gets, 3 unmaps in every ten
      if (phase < 4) {
        kinds.push_back(Kind::map);
        initiator.async_map(map_buffer.data() + next_map++ * page, page, Access::remote_read,
                            tally->handler<BackendRegion>(i));
      } else if (phase < 7) {
        kinds.push_back(Kind::get);
        const std::uint64_t offset = next_get++ * get_len;
        GetRequest request{pair.peer, local.value().id, offset, address(remote_buffer.data()) + offset, get_len,
                           remote.value().packed_key};
        initiator.async_get(std::move(request), tally->handler<void>(i));
      } else {
        kinds.push_back(Kind::unmap);
        initiator.async_unmap(premapped[next_unmap++], tally->handler<void>(i));
      }
    }
    initiator.async_shutdown(down.handler());
  }
  const auto shut = down.wait();
  ASSERT_TRUE(shut.has_value()) << "the shutdown was never answered";
  EXPECT_TRUE(*shut) << describe(*shut);
  EXPECT_TRUE(tally->wait_for_total(static_cast<int>(operations)))
      << "only " << tally->total() << " of " << operations << " callers were answered";
  // One more round trip through the backend: a second answer to any of the
  // hundred would be queued by now.
  auto late = map(initiator, map_buffer.data(), page, Access::remote_read);
  EXPECT_TRUE(failed_with(late, errc::shutting_down)) << describe(late);

  EXPECT_EQ(tally->total(), static_cast<int>(operations));
  for (std::size_t i = 0; i < operations; ++i) {
    EXPECT_EQ(tally->calls(i), 1) << "operation " << i;
    const auto code = tally->code(i);
    if (!code) continue;
    EXPECT_EQ(&code.category(), &corma::error_category()) << "operation " << i << ": " << code.message();
    if (kinds[i] != Kind::get) {
      EXPECT_EQ(code, errc::shutting_down) << "operation " << i << ": " << code.message();
    }
  }
  EXPECT_EQ(initiator.live_registrations(), 0u) << "registrations survived the shutdown";
  EXPECT_EQ(down.calls(), 1);
}

TEST_P(BackendContract, OperationsAfterShutdownAnswerShuttingDown) {
  auto remote_buffer = OwnedBuffer::allocate(64 * KiB);
  auto local_buffer = OwnedBuffer::allocate(64 * KiB);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  auto& initiator = *pair.initiator.backend;
  auto remote = map(*pair.target.backend, remote_buffer.data(), remote_buffer.size(), Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);
  const GetRequest request{pair.peer, local.value().id, 0, address(remote_buffer.data()), 64,
                           remote.value().packed_key};

  auto shut = call<void>([&](auto h) { initiator.async_shutdown(std::move(h)); });
  ASSERT_TRUE(shut) << describe(shut);
  EXPECT_EQ(initiator.live_registrations(), 0u);

  auto mapped = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  EXPECT_TRUE(failed_with(mapped, errc::shutting_down)) << "map: " << describe(mapped);
  auto got = get(initiator, request);
  EXPECT_TRUE(failed_with(got, errc::shutting_down)) << "get: " << describe(got);
  auto written = put(initiator, request);
  EXPECT_TRUE(failed_with(written, errc::shutting_down)) << "put: " << describe(written);
  auto unmapped = unmap(initiator, local.value().id);
  EXPECT_TRUE(failed_with(unmapped, errc::shutting_down)) << "unmap: " << describe(unmapped);
  auto offer = call<PeerOffer>([&](auto h) { initiator.async_peer_offer(std::move(h)); });
  EXPECT_TRUE(failed_with(offer, errc::shutting_down)) << "peer offer: " << describe(offer);
  auto their_offer = call<PeerOffer>([&](auto h) { pair.target.backend->async_peer_offer(std::move(h)); });
  ASSERT_TRUE(their_offer) << describe(their_offer);
  auto accepted = call<PeerAnswer>(
      [&](auto h) { initiator.async_peer_accept(their_offer.value().blob, std::move(h)); });
  EXPECT_TRUE(failed_with(accepted, errc::shutting_down)) << "peer accept: " << describe(accepted);
  // A second shutdown is answered too.
  auto again = call<void>([&](auto h) { initiator.async_shutdown(std::move(h)); });
  EXPECT_TRUE(again || failed_with(again, errc::shutting_down)) << describe(again);
  EXPECT_EQ(initiator.live_registrations(), 0u);
}

// ===========================================================================
// 11. A registry and its backend shut down in any order.
// ===========================================================================

enum class ShutdownOrder {
  registry_then_backend,  ///< the registry's shutdown answered, then the backend's starts
  backend_then_registry,  ///< the backend's shutdown answered, then the registry's starts
  registry_first,         ///< the backend's starts while the registry's still runs
  backend_first,          ///< the registry's starts while the backend's still drains
  same_tick,              ///< both start from one handler, nothing run in between
};

/// A registry over the initiator with many guards: some with a transfer in
/// flight (half of those already dropped), some with a deregistered() waiter,
/// some asking to deregister, and registrations still in flight; then both
/// shut down in `order`. Every caller is answered exactly once, and the
/// registry ends holding nothing: no bytes, no regions, no buffer kept.
void shut_down_registry_and_backend(const ContractParam& param, ShutdownOrder order) {
  constexpr std::size_t guards = 24;
  constexpr std::size_t in_flight = 2;  // registrations not yet answered
  constexpr std::size_t slice = 1 * MiB;
  // Declared first: outlives the backends, whose threads post into it.
  asio::io_context io;
  auto remote_buffer = OwnedBuffer::allocate(guards * slice);
  auto local_buffer = OwnedBuffer::allocate((guards + in_flight) * slice);
  fill(remote_buffer.data(), remote_buffer.size(), 61);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(param, pair));
  auto& backend = *pair.initiator.backend;
  auto remote_mapped = map(*pair.target.backend, remote_buffer.data(), remote_buffer.size(), Access::remote_read_write);
  ASSERT_TRUE(remote_mapped) << describe(remote_mapped);
  // Fully connected before anything shuts down (see PeerShutdownDuringGets...).
  {
    auto warm_region = map(backend, local_buffer.data(), 64, Access::local);
    ASSERT_TRUE(warm_region) << describe(warm_region);
    auto warm = get(backend, {pair.peer, warm_region.value().id, 0, address(remote_buffer.data()), 64,
                              remote_mapped.value().packed_key});
    ASSERT_TRUE(warm) << describe(warm);
    ASSERT_TRUE(unmap(backend, warm_region.value().id));
  }
  if (pair.initiator.set_transfer_delay) pair.initiator.set_transfer_delay(100ms);  // surely in flight
  const RemoteRegion remote{backend.wire_id(), 1, address(remote_buffer.data()), remote_buffer.size(),
                            remote_mapped.value().packed_key};

  Registry registry(pair.initiator.backend, RegistryConfig{.budget_bytes = 1024 * MiB});
  std::vector<RegionGuard> kept;
  std::vector<DeregisteredEvent> events;
  for (std::size_t i = 0; i < guards; ++i) {
    Result<RegionGuard> guard = fail(errc::backend, "not registered");
    if (i % 2 == 0) {
      auto owned = registry.async_register_owned(OwnedBuffer::allocate(slice), Access::local, asio::use_future).get();
      if (owned) guard = std::move(owned).value();
    } else {
      guard = registry.async_register(local_buffer.bytes().subspan(i * slice, slice), Access::local,
                                      asio::use_future).get();
    }
    ASSERT_TRUE(guard) << describe(guard);
    events.push_back(guard.value().deregistered());
    kept.push_back(std::move(guard).value());
  }

  // Every caller gets one slot: transfers, waiters, deregistrations,
  // registrations in flight.
  auto tally = std::make_shared<Tally>(2 * guards + in_flight);
  std::size_t callers = 0;
  for (std::size_t i = 0; i < guards; ++i) {
    auto& guard = kept[i];
    if (i % 3 == 0) {
      const TransferRange range{0, i * slice, slice};
      if (i % 2 == 0) {
        guard.async_get(pair.peer, remote, range, tally->handler<void>(callers++));
      } else {
        guard.async_put(pair.peer, remote, range, tally->handler<void>(callers++));
      }
      if (i % 6 == 0) guard = RegionGuard{};  // deregisters once the transfer ends
    } else if (i % 3 == 1) {
      events[i].async_wait(tally->handler<void>(callers++));
    } else if (i % 4 == 2) {
      guard.async_deregister(tally->handler<void>(callers++));
    }
  }
  for (std::size_t k = 0; k < in_flight; ++k) {
    auto memory = local_buffer.bytes().subspan((guards + k) * slice, slice);
    registry.async_register(memory, Access::local,
                            [h = tally->handler<void>(callers++)](Result<RegionGuard> r) {
                              // The guard, if any, is dropped here: it deregisters.
                              h(r ? Result<void>(success()) : Result<void>(std::move(r).error()));
                            });
  }

  Answer<void> registry_down;
  Answer<void> backend_down;
  auto registry_shutdown = [&] { registry.async_shutdown(10s, registry_down.handler()); };
  auto backend_shutdown = [&] { backend.async_shutdown(backend_down.handler()); };
  switch (order) {
    case ShutdownOrder::registry_then_backend:
      registry_shutdown();
      ASSERT_TRUE(registry_down.wait(10s)) << "the registry's shutdown was never answered";
      backend_shutdown();
      break;
    case ShutdownOrder::backend_then_registry:
      backend_shutdown();
      ASSERT_TRUE(backend_down.wait(10s)) << "the backend's shutdown was never answered";
      registry_shutdown();
      break;
    case ShutdownOrder::registry_first:
      registry_shutdown();
      backend_shutdown();
      break;
    case ShutdownOrder::backend_first:
      backend_shutdown();
      registry_shutdown();
      break;
    case ShutdownOrder::same_tick:
      asio::post(io, [&] {
        registry_shutdown();
        backend_shutdown();
      });
      io.run();
      break;
  }
  const auto registry_outcome = registry_down.wait(15s);
  ASSERT_TRUE(registry_outcome) << "the registry's shutdown was never answered";
  EXPECT_TRUE(*registry_outcome) << describe(*registry_outcome);
  const auto backend_outcome = backend_down.wait(15s);
  ASSERT_TRUE(backend_outcome) << "the backend's shutdown was never answered";
  EXPECT_TRUE(*backend_outcome) << describe(*backend_outcome);
  EXPECT_TRUE(tally->wait_for_total(static_cast<int>(callers)))
      << "only " << tally->total() << " of " << callers << " callers were answered";
  kept.clear();
  for (std::size_t i = 0; i < events.size(); ++i) EXPECT_TRUE(events[i].is_set()) << "region " << i;
  // One more round trip through the registry: a second answer to any
  // caller would have been queued by now.
  auto late = registry.async_register(local_buffer.bytes().first(slice), Access::local, asio::use_future).get();
  EXPECT_TRUE(failed_with(late, errc::shutting_down)) << describe(late);
  for (std::size_t i = 0; i < callers; ++i) {
    EXPECT_EQ(tally->calls(i), 1) << "caller " << i;
    const auto code = tally->code(i);
    if (code) {
      EXPECT_EQ(&code.category(), &corma::error_category()) << "caller " << i << ": " << code.message();
    }
  }
  const auto stats = registry.stats();
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.regions, 0u);
  EXPECT_EQ(stats.leaked_owned_buffers, 0u);
  EXPECT_EQ(backend.live_registrations(), 0u);
  EXPECT_EQ(registry_down.calls(), 1);
  EXPECT_EQ(backend_down.calls(), 1);
}

TEST_P(BackendContract, RegistryShutDownThenBackendLeavesNothingBehind) {
  shut_down_registry_and_backend(GetParam(), ShutdownOrder::registry_then_backend);
}

TEST_P(BackendContract, BackendShutDownThenRegistryLeavesNothingBehind) {
  shut_down_registry_and_backend(GetParam(), ShutdownOrder::backend_then_registry);
}

TEST_P(BackendContract, RegistryShuttingDownFirstLeavesNothingBehind) {
  shut_down_registry_and_backend(GetParam(), ShutdownOrder::registry_first);
}

TEST_P(BackendContract, BackendShuttingDownFirstLeavesNothingBehind) {
  shut_down_registry_and_backend(GetParam(), ShutdownOrder::backend_first);
}

TEST_P(BackendContract, RegistryAndBackendShuttingDownInOneTickLeaveNothingBehind) {
  shut_down_registry_and_backend(GetParam(), ShutdownOrder::same_tick);
}

}  // namespace
}  // namespace corma::contract
