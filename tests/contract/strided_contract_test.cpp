// The backend contract for strided transfers (TransferRequest::blocks): a
// KV cache's layout, many equal blocks at a fixed stride on each side, moved
// as one transfer or as one batch element. Every block lands, no byte
// between blocks is touched, and a stride layout that reaches outside its
// regions or overflows is refused whole before the provider sees it.
#include "contract/backend_contract.hpp"
#include "contract/batch_helpers.hpp"
#include "contract/contract_helpers.hpp"

#include <corma/region_guard.hpp>
#include <corma/registry.hpp>

#include <boost/asio/use_future.hpp>

namespace corma::contract {
namespace {

constexpr std::uint64_t block = 100;
constexpr std::uint64_t local_stride = 256;
constexpr std::uint64_t remote_stride = 384;
constexpr std::uint64_t blocks = 64;
constexpr std::size_t region_size = 64 * KiB;

/// `blocks` blocks from `local_offset` / `remote_offset` at the test's strides.
TransferRequest strided(const Mapped& m, std::uint64_t local_offset, std::uint64_t remote_offset,
                        std::uint64_t count = blocks) {
  auto r = m.element(local_offset, remote_offset, block);
  r.blocks = count;
  r.local_stride = local_stride;
  r.remote_stride = remote_stride;
  return r;
}

/// After a strided transfer from `from` to `to` (with `to_before` its bytes
/// before): every block equal on both sides, every other byte of `to` as it
/// was.
void expect_blocks_moved(const TransferRequest& r, bool is_put, const std::byte* local, const std::byte* remote_base,
                         std::uint64_t remote_base_addr, const std::vector<std::byte>& to_before) {
  const std::byte* to = is_put ? remote_base : local;
  for (std::uint64_t i = 0; i < r.blocks; ++i) {
    const std::byte* here = local + r.local_offset_of(i);
    const std::byte* there = remote_base + (r.remote_addr_of(i) - remote_base_addr);
    ASSERT_TRUE(same_bytes(here, there, r.len)) << "block " << i << " did not move";
  }
  // Every byte outside the blocks on the written side is as it was.
  std::vector<bool> in_block(to_before.size(), false);
  for (std::uint64_t i = 0; i < r.blocks; ++i) {
    const std::uint64_t start = is_put ? r.remote_addr_of(i) - remote_base_addr : r.local_offset_of(i);
    for (std::uint64_t b = 0; b < r.len; ++b) in_block[start + b] = true;
  }
  for (std::size_t b = 0; b < to_before.size(); ++b) {
    if (!in_block[b]) {
      ASSERT_EQ(to[b], to_before[b]) << "byte " << b << " between blocks was written";
    }
  }
}

TEST_P(BackendContract, StridedGetsAndPutsMoveEveryBlockAndNothingBetween) {
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), region_size, m));
  auto& initiator = *m.pair.initiator.backend;
  const auto remote_base = address(m.remote_buffer.data());
  for (const bool is_put : {false, true}) {
    SCOPED_TRACE(is_put ? "strided put" : "strided get");
    fill(m.remote_buffer.data(), region_size, is_put ? 71 : 72);
    fill(m.local_buffer.data(), region_size, is_put ? 73 : 74);
    auto* written = is_put ? m.remote_buffer.data() : m.local_buffer.data();
    const auto before = copy_of(written, region_size);
    const auto r = strided(m, 8, 16);
    auto moved = is_put ? put(initiator, r) : get(initiator, r);
    ASSERT_TRUE(moved) << describe(moved);
    expect_blocks_moved(r, is_put, m.local_buffer.data(), m.remote_buffer.data(), remote_base, before);
  }
  EXPECT_TRUE(unmap(initiator, m.local.id));
  EXPECT_EQ(initiator.live_registrations(), 0u);
}

TEST_P(BackendContract, StridedBatchElementsMoveEveryBlockBesideContiguousOnes) {
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), region_size, m));
  auto& initiator = *m.pair.initiator.backend;
  const auto remote_base = address(m.remote_buffer.data());
  for (const bool is_put : {false, true}) {
    SCOPED_TRACE(is_put ? "put batch" : "get batch");
    fill(m.remote_buffer.data(), region_size, is_put ? 75 : 76);
    fill(m.local_buffer.data(), region_size, is_put ? 77 : 78);
    auto* written = is_put ? m.remote_buffer.data() : m.local_buffer.data();
    const auto before = copy_of(written, region_size);
    // Two strided elements, 32 blocks each, interleaved on both sides (the
    // second starts half a stride on), and a contiguous one past them all.
    const auto first = strided(m, 0, 0, 32);
    const auto second = strided(m, local_stride / 2, remote_stride / 2, 32);
    const auto contiguous = m.element(40 * KiB, 40 * KiB, 4096);
    auto outcome = is_put ? put_batch(initiator, {first, second, contiguous})
                          : get_batch(initiator, {first, second, contiguous});
    ASSERT_TRUE(outcome) << describe(outcome);
    EXPECT_TRUE(outcome.value().all_succeeded()) << outcome.value().failures.front().error.message();
    for (const auto& r : {first, second}) {
      for (std::uint64_t i = 0; i < r.blocks; ++i) {
        EXPECT_TRUE(same_bytes(m.local_buffer.data() + r.local_offset_of(i),
                               m.remote_buffer.data() + (r.remote_addr_of(i) - remote_base), r.len))
            << "block " << i << " did not move";
      }
    }
    EXPECT_TRUE(same_bytes(m.local_buffer.data() + 40 * KiB, m.remote_buffer.data() + 40 * KiB, 4096));
    // Nothing outside the three elements was written.
    const auto last = [&](const TransferRequest& r) {
      return (is_put ? r.remote_addr_of(r.blocks - 1) - remote_base : r.local_offset_of(r.blocks - 1)) + r.len;
    };
    const std::size_t untouched_from = std::max(last(first), last(second));
    EXPECT_TRUE(same_bytes(written + untouched_from, before.data() + untouched_from, 40 * KiB - untouched_from));
    EXPECT_TRUE(same_bytes(written + 44 * KiB, before.data() + 44 * KiB, region_size - 44 * KiB));
  }
}

TEST_P(BackendContract, StridedLayoutsOutsideTheirRegionsAreRefusedWholeBeforeTheProvider) {
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), region_size, m));
  auto& initiator = *m.pair.initiator.backend;
  fill(m.remote_buffer.data(), region_size, 79);
  fill(m.local_buffer.data(), region_size, 80);
  const auto remote_before = copy_of(m.remote_buffer.data(), region_size);
  const auto local_before = copy_of(m.local_buffer.data(), region_size);

  std::vector<std::pair<const char*, TransferRequest>> bad;
  auto zero_blocks = strided(m, 0, 0);
  zero_blocks.blocks = 0;
  bad.emplace_back("zero blocks", zero_blocks);
  auto too_many = strided(m, 0, 0);
  too_many.blocks = max_transfer_blocks + 1;
  too_many.local_stride = too_many.remote_stride = 0;
  bad.emplace_back("more blocks than allowed", too_many);
  auto overlapping = strided(m, 0, 0);
  overlapping.local_stride = block - 1;
  bad.emplace_back("local blocks that overlap", overlapping);
  auto overlapping_remote = strided(m, 0, 0);
  overlapping_remote.remote_stride = block / 2;
  bad.emplace_back("remote blocks that overlap", overlapping_remote);
  // The first block inside, the last one past the end of each side.
  bad.emplace_back("last local block past the region", strided(m, region_size - 63 * local_stride - block + 1, 0));
  bad.emplace_back("last remote block past the key", strided(m, 0, region_size - 63 * remote_stride - block + 1));
  auto wrapping = strided(m, 0, 0, 3);
  wrapping.local_stride = u64_max / 2 + 1;  // two strides wrap to the start
  bad.emplace_back("local strides that overflow", wrapping);
  auto wrapping_remote = strided(m, 0, 0, 3);
  wrapping_remote.remote_stride = u64_max / 2 + 1;
  bad.emplace_back("remote strides that overflow", wrapping_remote);

  for (const bool is_put : {false, true}) {
    for (const auto& [what, r] : bad) {
      SCOPED_TRACE(std::string(is_put ? "put: " : "get: ") + what);
      auto single = is_put ? put(initiator, r) : get(initiator, r);
      EXPECT_TRUE(failed_with(single, errc::out_of_range)) << describe(single);
      auto batch = is_put ? put_batch(initiator, {r, m.element(0, 0, 8)}) : get_batch(initiator, {r, m.element(0, 0, 8)});
      ASSERT_TRUE(batch) << describe(batch);
      const auto failure = failure_of(batch.value(), 0);
      ASSERT_TRUE(failure) << "the bad strided element succeeded";
      EXPECT_TRUE(failure->is(errc::out_of_range)) << failure->message();
      EXPECT_FALSE(failure_of(batch.value(), 1)) << "the good element beside it failed";
    }
    // Only the good 8-byte elements moved anything: bytes [0, 8).
    EXPECT_TRUE(same_bytes(m.remote_buffer.data() + 8, remote_before.data() + 8, region_size - 8));
    EXPECT_TRUE(same_bytes(m.local_buffer.data() + 8, local_before.data() + 8, region_size - 8));
  }
}

// Through the Registry: a RegionGuard's strided get and put, and a strided
// element of RegionGuard::async_get_batch, move every block; a layout past
// the guard's bytes or the remote region is refused before the backend.
TEST_P(BackendContract, RegionGuardsMoveStridedRangesAndRefuseThemPastTheirRegions) {
  Mapped m;
  ASSERT_NO_FATAL_FAILURE(set_up(GetParam(), region_size, m));
  auto& initiator = *m.pair.initiator.backend;
  // A second local buffer, registered through the Registry.
  auto memory = OwnedBuffer::allocate(region_size);
  Registry registry(m.pair.initiator.backend, RegistryConfig{.budget_bytes = 2 * region_size});
  auto guard = registry.async_register(memory.bytes(), Access::local, asio::use_future).get();
  ASSERT_TRUE(guard) << describe(guard);
  const RemoteRegion remote{initiator.wire_id(), 1, address(m.remote_buffer.data()), region_size,
                            m.remote.packed_key};
  const TransferRange range{8, 16, block, blocks, local_stride, remote_stride};
  const auto check_blocks = [&] {
    for (std::uint64_t i = 0; i < blocks; ++i) {
      ASSERT_TRUE(same_bytes(memory.data() + range.local_offset + i * local_stride,
                             m.remote_buffer.data() + range.remote_offset + i * remote_stride, block))
          << "block " << i << " did not move";
    }
  };
  fill(m.remote_buffer.data(), region_size, 81);
  fill(memory.data(), region_size, 82);
  auto got = guard.value().async_get(m.pair.peer, remote, range, asio::use_future).get();
  ASSERT_TRUE(got) << describe(got);
  check_blocks();
  fill(memory.data(), region_size, 83);
  auto put_done = guard.value().async_put(m.pair.peer, remote, range, asio::use_future).get();
  ASSERT_TRUE(put_done) << describe(put_done);
  check_blocks();
  fill(memory.data(), region_size, 84);
  auto batch = RegionGuard::async_get_batch(m.pair.peer, {BatchedGet{&guard.value(), remote, range}},
                                            asio::use_future)
                   .get();
  ASSERT_TRUE(batch) << describe(batch);
  EXPECT_TRUE(batch.value().all_succeeded()) << batch.value().failures.front().error.message();
  check_blocks();

  auto past_local = range;
  past_local.local_offset = region_size - (blocks - 1) * local_stride - block + 1;
  auto past_remote = range;
  past_remote.remote_offset = region_size - (blocks - 1) * remote_stride - block + 1;
  for (const auto& bad : {past_local, past_remote}) {
    auto refused = guard.value().async_get(m.pair.peer, remote, bad, asio::use_future).get();
    EXPECT_TRUE(failed_with(refused, errc::out_of_range)) << describe(refused);
  }
  EXPECT_TRUE(guard.value().async_deregister(asio::use_future).get());
}

}  // namespace
}  // namespace corma::contract
