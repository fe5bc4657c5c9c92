#include <corma/region_guard.hpp>

#include "guard_share.hpp"
#include "latch.hpp"
#include "region_state.hpp"

#include <corma/detail/completion.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>

#include <algorithm>
#include <atomic>
#include <utility>

namespace corma {

using detail::Completion;
using VoidCompletion = Completion<void(Result<void>)>;

bool DeregisteredEvent::is_set() const { return latch_ && latch_->is_set(); }

void DeregisteredEvent::do_wait(const std::shared_ptr<detail::Latch>& latch,
                                asio::any_completion_handler<void(Result<void>)> handler) {
  if (!latch) {
    return VoidCompletion(std::move(handler)).post(fail(errc::region_not_found, "empty event"));
  }
  latch->wait(std::move(handler));
}

RegionGuard::RegionGuard() noexcept = default;
RegionGuard::RegionGuard(std::shared_ptr<detail::RegionState> state) noexcept : state_(std::move(state)) {}
RegionGuard::RegionGuard(std::shared_ptr<detail::RegionState> state,
                         std::shared_ptr<detail::GuardShare> share) noexcept
    : state_(std::move(state)), share_(std::move(share)) {}
RegionGuard::RegionGuard(RegionGuard&& other) noexcept
    : state_(std::move(other.state_)), share_(std::move(other.share_)) {}

RegionGuard& RegionGuard::operator=(RegionGuard&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    share_ = std::move(other.share_);
  }
  return *this;
}

RegionGuard::~RegionGuard() { release(); }

void RegionGuard::release() noexcept {
  if (!state_) return;
  if (share_) {
    // A slice, or a cached registration's guard: its bytes go back once its
    // transfers are done; the registration is its arena's or the cache's.
    try {
      share_->let_go();
    } catch (...) {
      // Out of memory setting its event: the slice stays out of its arena,
      // which is safe.
    }
    share_.reset();
    state_.reset();
    return;
  }
  try {
    state_->request_deregistration({});
  } catch (...) {
    // Out of memory while queueing the unmap: the region stays registered
    // and charged, which is safe; the registry's shutdown still reaches it.
  }
  state_.reset();
}

std::byte* RegionGuard::data() const noexcept {
  if (!state_) return nullptr;
  return state_->memory().data() + (share_ ? share_->offset() : 0);
}
std::size_t RegionGuard::size() const noexcept {
  if (!state_) return 0;
  return share_ ? share_->len() : state_->memory().size();
}
RegionId RegionGuard::id() const noexcept { return state_ ? state_->region().id : RegionId{}; }
std::uint64_t RegionGuard::charged_bytes() const noexcept { return state_ && !share_ ? state_->charged() : 0; }

const BackendRegion& RegionGuard::backend_region() const noexcept {
  static const BackendRegion empty{};
  return state_ ? state_->region() : empty;
}

RemoteRegion RegionGuard::remote() const {
  if (!state_) return {};
  return RemoteRegion{state_->backend()->wire_id(), state_->generation(), reinterpret_cast<std::uint64_t>(data()),
                      size(), state_->region().packed_key};
}

DeregisteredEvent RegionGuard::deregistered() const {
  if (!state_) return DeregisteredEvent(nullptr);
  return DeregisteredEvent(share_ ? share_->memory_released() : state_->deregistered());
}

namespace {

/// The transfer `range` describes, from `local_offset` in the registration
/// to the peer's `remote_addr`.
TransferRequest request_for(PeerId peer, RegionId local, std::uint64_t local_offset, std::uint64_t remote_addr,
                            const TransferRange& range, TransferKey key) {
  return TransferRequest{peer,      local,          local_offset,       remote_addr,       range.len,
                         std::move(key), range.blocks, range.local_stride, range.remote_stride};
}

/// Whether `range` may move between the guard's bytes (`state`'s region, or
/// `share`'s slice of it) and `remote`: both slices inside their regions, the
/// remote region of this backend, and the region (and slice) still admitting
/// transfers (then one is begun: end it once done). Gives the local offset
/// in the registration.
Result<std::uint64_t> begin_checked_transfer(detail::RegionState& state, detail::GuardShare* share,
                                             const RemoteRegion& remote, const TransferRange& range) {
  const std::uint64_t base = share != nullptr ? share->offset() : 0;
  const std::uint64_t len = share != nullptr ? share->len() : state.memory().size();
  // Both sides checked as a transfer's are, every block inside: offsets in
  // the guard's bytes and in the remote region (the backend checks a put's
  // access against the key).
  const auto shape = request_for(PeerId{}, RegionId{}, range.local_offset, range.remote_offset, range, {});
  CORMA_TRY(validate_local_range(shape, len));
  CORMA_TRY(validate_remote_range(false, shape, 0, remote.len, Access::remote_read));

  const auto& backend = state.backend();
  if (remote.backend != backend->wire_id()) {
    return fail(errc::invalid_key, "remote region belongs to backend " +
                                       std::to_string(static_cast<unsigned>(remote.backend)) + ", not " +
                                       std::string(backend->key()));
  }
  if (share != nullptr && !share->begin_transfer()) {
    return fail(errc::region_not_found, "slice given back to its arena");
  }
  if (!state.begin_transfer()) {
    if (share != nullptr) share->end_transfer();
    return fail(errc::region_not_found, "region is being deregistered");
  }
  return base + range.local_offset;
}

}  // namespace

void RegionGuard::do_transfer(std::shared_ptr<detail::RegionState> state, std::shared_ptr<detail::GuardShare> share,
                              bool is_put, PeerId peer, RemoteRegion remote, TransferRange range,
                              asio::any_completion_handler<void(Result<void>)> handler) {
  VoidCompletion completion(std::move(handler));
  if (!state) return completion.post(fail(errc::region_not_found, "empty region guard"));
  auto begun = begin_checked_transfer(*state, share.get(), remote, range);
  if (!begun) return completion.post(state->backend()->progress_executor(), std::move(begun).error());
  const auto& backend = state->backend();
  auto request = request_for(peer, state->region().id, begun.value(), remote.addr + range.remote_offset, range,
                             std::move(remote.packed_key));
  auto slot = completion.cancellation_slot();
  // `backend` stays valid: the state, moved into the callback, keeps it; a
  // slice stays out of its arena until the transfer ends.
  auto done = asio::bind_cancellation_slot(
      slot, [state = std::move(state), share = std::move(share),
             completion = std::move(completion)](Result<void> outcome) mutable {
        state->end_transfer();
        if (share) share->end_transfer();
        completion.dispatch(std::move(outcome));
      });
  if (is_put) {
    backend->async_put(std::move(request), std::move(done));
  } else {
    backend->async_get(std::move(request), std::move(done));
  }
}

void RegionGuard::do_get_batch(PeerId peer, std::vector<BatchedGet> gets,
                               asio::any_completion_handler<void(Result<BatchOutcome>)> handler) {
  using BatchCompletion = Completion<void(Result<BatchOutcome>)>;
  BatchCompletion completion(std::move(handler));
  // Elements refused here answer for themselves; the rest go to the backend
  // as one batch, whose indices `submitted` maps back.
  std::vector<BatchFailure> refused;
  std::vector<std::size_t> submitted;
  struct Begun {
    std::shared_ptr<detail::RegionState> state;
    std::shared_ptr<detail::GuardShare> share;  // a slice, kept out of its arena until the batch ends
  };
  std::vector<Begun> begun;
  TransferBatch batch;
  submitted.reserve(gets.size());
  begun.reserve(gets.size());
  batch.reserve(gets.size());
  std::shared_ptr<RdmaBackend> backend;
  for (std::size_t i = 0; i < gets.size(); ++i) {
    auto& get = gets[i];
    auto state = get.into != nullptr ? get.into->state_ : nullptr;
    auto share = get.into != nullptr ? get.into->share_ : nullptr;
    Result<std::uint64_t> admitted = fail(errc::region_not_found, "empty region guard");
    if (state && backend && state->backend() != backend) {
      admitted = fail(errc::region_not_found, "region of another backend than the batch's first");
    } else if (state) {
      admitted = begin_checked_transfer(*state, share.get(), get.remote, get.range);
    }
    if (!admitted) {
      refused.push_back(BatchFailure{i, std::move(admitted).error()});
      continue;
    }
    backend = state->backend();
    TransferKey key = std::move(get.remote.packed_key);
    if (get.key != RemoteKeyId::none) key = get.key;
    batch.push_back(request_for(peer, state->region().id, admitted.value(), get.remote.addr + get.range.remote_offset,
                                get.range, std::move(key)));
    submitted.push_back(i);
    begun.push_back(Begun{std::move(state), std::move(share)});
  }
  if (batch.empty()) {
    // Answered from here, never inside this call: through the handler's own
    // executor, else a backend's that one of the guards names.
    asio::any_io_executor via;
    for (const auto& get : gets) {
      if (get.into != nullptr && get.into->state_) {
        via = get.into->state_->backend()->progress_executor();
        break;
      }
    }
    return completion.post(via, BatchOutcome{gets.size(), std::move(refused)});
  }
  auto slot = completion.cancellation_slot();
  auto done = asio::bind_cancellation_slot(
      slot, [begun = std::move(begun), submitted = std::move(submitted), refused = std::move(refused),
             size = gets.size(), completion = std::move(completion)](Result<BatchOutcome> outcome) mutable {
        for (const auto& element : begun) {
          element.state->end_transfer();
          if (element.share) element.share->end_transfer();
        }
        if (!outcome) return completion.dispatch(std::move(outcome).error());
        // Back to the caller's indices, in order.
        auto failures = std::move(refused);
        for (auto& failure : outcome.value().failures) {
          failures.push_back(BatchFailure{submitted[failure.index], std::move(failure.error)});
        }
        std::sort(failures.begin(), failures.end(),
                  [](const BatchFailure& a, const BatchFailure& b) { return a.index < b.index; });
        completion.dispatch(BatchOutcome{size, std::move(failures)});
      });
  backend->async_get_batch(std::move(batch), std::move(done));
}

void RegionGuard::do_deregister(const std::shared_ptr<detail::RegionState>& state,
                                const std::shared_ptr<detail::GuardShare>& share,
                                asio::any_completion_handler<void(Result<void>)> handler) {
  if (share) {
    // A slice or a cached registration's guard: let go, and answer once the
    // memory may be freed or reused (a slice back in its arena; a cached
    // registration, kept no longer, unmapped once its other guards went).
    auto released = share->memory_released();
    share->deregister();
    return released->wait(std::move(handler));
  }
  auto completion = std::make_shared<VoidCompletion>(std::move(handler));
  if (!state) return completion->post(success());
  // The listener may run inside this call (the region was already released):
  // then it must post, never complete inline.
  auto initiating = std::make_shared<std::atomic<bool>>(true);
  state->request_deregistration([completion, initiating, via = state->backend()->progress_executor()](
                                    const Result<void>& outcome) {
    if (initiating->load(std::memory_order_acquire)) {
      completion->post(via, outcome);
    } else {
      completion->dispatch(outcome);
    }
  });
  initiating->store(false, std::memory_order_release);
}

}  // namespace corma
