// What the batch and strided contract tests share: two connected backends
// with a region each, and batch calls answered within the limit.
#pragma once

#include "contract/contract_helpers.hpp"

#include <optional>

namespace corma::contract {

inline Result<BatchOutcome> get_batch(RdmaBackend& backend, TransferBatch batch,
                               std::chrono::milliseconds limit = answer_limit) {
  return call<BatchOutcome>([&](auto h) { backend.async_get_batch(std::move(batch), std::move(h)); }, limit);
}
inline Result<BatchOutcome> put_batch(RdmaBackend& backend, TransferBatch batch) {
  return call<BatchOutcome>([&](auto h) { backend.async_put_batch(std::move(batch), std::move(h)); });
}

/// The error of element `index`, or nullopt when it succeeded.
inline std::optional<Error> failure_of(const BatchOutcome& outcome, std::size_t index) {
  for (const auto& failure : outcome.failures) {
    if (failure.index == index) return failure.error;
  }
  return std::nullopt;
}

/// Every index appears at most once, in ascending order, inside the batch.
inline void expect_well_formed(const BatchOutcome& outcome, std::size_t size) {
  EXPECT_EQ(outcome.size, size);
  for (std::size_t i = 0; i < outcome.failures.size(); ++i) {
    EXPECT_LT(outcome.failures[i].index, size);
    if (i > 0) {
      EXPECT_LT(outcome.failures[i - 1].index, outcome.failures[i].index) << "not in index order";
    }
  }
}

/// Two connected backends with a `size`-byte region each: the target's for
/// peers to read and write, the initiator's local.
struct Mapped {
  OwnedBuffer remote_buffer;
  OwnedBuffer local_buffer;
  Pair pair;
  BackendRegion remote;
  BackendRegion local;

  [[nodiscard]] TransferRequest element(std::uint64_t local_offset, std::uint64_t remote_offset,
                                        std::uint64_t len) const {
    return TransferRequest{pair.peer, local.id, local_offset, address(remote_buffer.data()) + remote_offset, len,
                           remote.packed_key};
  }
};

inline void set_up(const ContractParam& param, std::size_t size, Mapped& m) {
  m.remote_buffer = OwnedBuffer::allocate(size);
  m.local_buffer = OwnedBuffer::allocate(size);
  ASSERT_NO_FATAL_FAILURE(connect(param, m.pair));
  auto remote = map(*m.pair.target.backend, m.remote_buffer.data(), size, Access::remote_read_write);
  ASSERT_TRUE(remote) << describe(remote);
  m.remote = std::move(remote).value();
  auto local = map(*m.pair.initiator.backend, m.local_buffer.data(), size, Access::local);
  ASSERT_TRUE(local) << describe(local);
  m.local = std::move(local).value();
}

}  // namespace corma::contract
