// The backend contract for imported keys (docs/architecture.md, "Imported
// keys"): a peer's packed key checked and unpacked once, then named by
// transfers instead of their packed bytes, until it is released or its peer
// closes. Linked into every contract executable with contract_test.cpp.
#include "contract/backend_contract.hpp"
#include "contract/contract_helpers.hpp"

namespace corma::contract {
namespace {

Result<RemoteKeyId> import_key(RdmaBackend& backend, PeerId peer, PackedKey key) {
  return call<RemoteKeyId>([&](auto h) { backend.async_import_key(peer, std::move(key), std::move(h)); });
}
Result<void> release_key(RdmaBackend& backend, RemoteKeyId key) {
  return call<void>([&](auto h) { backend.async_release_key(key, std::move(h)); });
}

/// Two connected backends, a 64 KiB region on each (the target's for peers
/// to read and write), and the target's key imported by the initiator.
struct Imported {
  OwnedBuffer remote_buffer = OwnedBuffer::allocate(64 * KiB);
  OwnedBuffer local_buffer = OwnedBuffer::allocate(64 * KiB);
  Pair pair;
  BackendRegion remote;
  BackendRegion local;
  RemoteKeyId key{};

  /// A transfer naming the imported key only (no packed bytes).
  [[nodiscard]] TransferRequest by_key(std::uint64_t offset, std::uint64_t len) const {
    return TransferRequest{pair.peer, local.id, offset, address(remote_buffer.data()) + offset, len, key};
  }
};

void set_up(const ContractParam& param, Imported& t) {
  ASSERT_NO_FATAL_FAILURE(connect(param, t.pair));
  auto remote = map(*t.pair.target.backend, t.remote_buffer.data(), t.remote_buffer.size(), Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  t.remote = std::move(remote).value();
  auto local = map(*t.pair.initiator.backend, t.local_buffer.data(), t.local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);
  t.local = std::move(local).value();
  // The connection is wired up for real first: UCX 1.13 aborts the process
  // when a worker is destroyed while an endpoint's wire-up is still pending
  // (see PeerShutdownDuringGetsAnswersEveryCaller).
  auto warm = get(*t.pair.initiator.backend, GetRequest{t.pair.peer, t.local.id, 0, address(t.remote_buffer.data()),
                                                        64, t.remote.packed_key});
  ASSERT_TRUE(warm) << describe(warm);
  auto key = import_key(*t.pair.initiator.backend, t.pair.peer, t.remote.packed_key);
  ASSERT_TRUE(key) << describe(key);
  EXPECT_NE(key.value(), RemoteKeyId::none);
  t.key = key.value();
}

TEST_P(BackendContract, TransfersNamingAnImportedKeyMoveTheRightBytes) {
  Imported t;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), t));
  auto& initiator = *t.pair.initiator.backend;
  const std::size_t size = t.local_buffer.size();
  fill(t.remote_buffer.data(), size, 61);
  fill(t.local_buffer.data(), size, 62);

  auto got = get(initiator, t.by_key(0, size));
  ASSERT_TRUE(got) << describe(got);
  EXPECT_TRUE(same_bytes(t.local_buffer.data(), t.remote_buffer.data(), size));

  fill(t.local_buffer.data(), size, 63);
  auto written = put(initiator, t.by_key(100, 1000));
  ASSERT_TRUE(written) << describe(written);
  EXPECT_TRUE(same_bytes(t.remote_buffer.data() + 100, t.local_buffer.data() + 100, 1000));

  // In a batch too, and the key's range still bounds every element.
  fill(t.remote_buffer.data(), size, 64);
  auto past_the_end = t.by_key(size - 8, 16);
  past_the_end.local_offset = 0;
  TransferBatch batch{t.by_key(0, 4096), t.by_key(8192, 8192), past_the_end};
  auto outcome = call<BatchOutcome>([&](auto h) { initiator.async_get_batch(batch, std::move(h)); });
  ASSERT_TRUE(outcome) << describe(outcome);
  ASSERT_EQ(outcome.value().failures.size(), 1u);
  EXPECT_EQ(outcome.value().failures[0].index, 2u);
  EXPECT_TRUE(outcome.value().failures[0].error.is(errc::out_of_range)) << outcome.value().failures[0].error.message();
  EXPECT_TRUE(same_bytes(t.local_buffer.data(), t.remote_buffer.data(), 4096));
  EXPECT_TRUE(same_bytes(t.local_buffer.data() + 8192, t.remote_buffer.data() + 8192, 8192));
}

TEST_P(BackendContract, ImportRefusesBadKeysAndPeersAndTransfersRefuseUnknownKeys) {
  Imported t;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), t));
  auto& initiator = *t.pair.initiator.backend;

  auto empty = import_key(initiator, t.pair.peer, {});
  EXPECT_TRUE(failed_with(empty, errc::invalid_key)) << describe(empty);
  auto oversized = import_key(initiator, t.pair.peer, PackedKey(max_packed_key_size + 1, std::byte{1}));
  EXPECT_TRUE(failed_with(oversized, errc::invalid_key)) << describe(oversized);
  auto garbage = import_key(initiator, t.pair.peer, PackedKey(t.remote.packed_key.size(), std::byte{0x5a}));
  EXPECT_TRUE(failed_with(garbage, errc::invalid_key)) << describe(garbage);
  auto truncated = t.remote.packed_key;
  truncated.resize(truncated.size() / 2);
  auto half = import_key(initiator, t.pair.peer, truncated);
  EXPECT_TRUE(failed_with(half, errc::invalid_key)) << describe(half);
  auto no_peer = import_key(initiator, PeerId{u64_max}, t.remote.packed_key);
  EXPECT_TRUE(failed_with(no_peer, errc::peer_unreachable)) << describe(no_peer);

  auto never_imported = t.by_key(0, 8);
  never_imported.key = RemoteKeyId{u64_max};
  auto refused = get(initiator, never_imported);
  EXPECT_TRUE(failed_with(refused, errc::invalid_key)) << describe(refused);
  // A key id names a key for its own peer only.
  auto other_peer = call<PeerOffer>([&](auto h) { initiator.async_peer_offer(std::move(h)); });
  ASSERT_TRUE(other_peer) << describe(other_peer);
  auto wrong_peer = t.by_key(0, 8);
  wrong_peer.peer = other_peer.value().peer;
  auto misdirected = get(initiator, wrong_peer);
  EXPECT_TRUE(is_corma_error(misdirected)) << "a key used with another peer: " << describe(misdirected);
}

TEST_P(BackendContract, ReleasedKeysAreRefusedAndReleaseIsIdempotent) {
  Imported t;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), t));
  auto& initiator = *t.pair.initiator.backend;
  fill(t.remote_buffer.data(), t.remote_buffer.size(), 71);

  // Released while a transfer that names it is queued: that transfer was
  // admitted first and ends with its real result.
  Answer<void> in_flight;
  Answer<void> released;
  {
    ProgressBlocker blocker(initiator);
    ASSERT_TRUE(blocker.blocked());
    Initiating scope;
    initiator.async_get(t.by_key(0, t.local_buffer.size()), in_flight.handler());
    initiator.async_release_key(t.key, released.handler());
  }
  const auto got = in_flight.wait();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(*got) << describe(*got);
  EXPECT_TRUE(same_bytes(t.local_buffer.data(), t.remote_buffer.data(), t.local_buffer.size()));
  const auto r = released.wait();
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(*r) << describe(*r);

  auto after = get(initiator, t.by_key(0, 8));
  EXPECT_TRUE(failed_with(after, errc::invalid_key)) << describe(after);
  auto again = release_key(initiator, t.key);
  EXPECT_TRUE(again) << describe(again);
  auto unknown = release_key(initiator, RemoteKeyId{u64_max});
  EXPECT_TRUE(unknown) << describe(unknown);

  // Imported again, it is a new key that works.
  auto reimported = import_key(initiator, t.pair.peer, t.remote.packed_key);
  ASSERT_TRUE(reimported) << describe(reimported);
  EXPECT_NE(reimported.value(), t.key);
  t.key = reimported.value();
  auto works = get(initiator, t.by_key(0, 8));
  EXPECT_TRUE(works) << describe(works);
}

TEST_P(BackendContract, ImportedKeysGoWithTheirPeer) {
  Imported t;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), t));
  auto& initiator = *t.pair.initiator.backend;
  auto warm = get(initiator, t.by_key(0, 64));
  ASSERT_TRUE(warm) << describe(warm);
  auto closed = call<void>([&](auto h) { initiator.async_peer_close(t.pair.peer, std::move(h)); });
  ASSERT_TRUE(closed) << describe(closed);
  auto after = get(initiator, t.by_key(0, 64));
  EXPECT_TRUE(failed_with(after, errc::peer_unreachable)) << describe(after);
  auto reimport = import_key(initiator, t.pair.peer, t.remote.packed_key);
  EXPECT_TRUE(failed_with(reimport, errc::peer_unreachable)) << describe(reimport);
  auto release = release_key(initiator, t.key);
  EXPECT_TRUE(release) << "releasing a key whose peer closed: " << describe(release);
  EXPECT_TRUE(unmap(initiator, t.local.id));
  EXPECT_EQ(initiator.live_registrations(), 0u);
}

}  // namespace
}  // namespace corma::contract
