#include <corma/region_guard.hpp>

#include "latch.hpp"
#include "region_state.hpp"

#include <corma/detail/completion.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>

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
RegionGuard::RegionGuard(RegionGuard&& other) noexcept : state_(std::move(other.state_)) {}

RegionGuard& RegionGuard::operator=(RegionGuard&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
  }
  return *this;
}

RegionGuard::~RegionGuard() { release(); }

void RegionGuard::release() noexcept {
  if (!state_) return;
  try {
    state_->request_deregistration({});
  } catch (...) {
    // Out of memory while queueing the unmap: the region stays registered
    // and charged, which is safe; the registry's shutdown still reaches it.
  }
  state_.reset();
}

std::byte* RegionGuard::data() const noexcept { return state_ ? state_->memory().data() : nullptr; }
std::size_t RegionGuard::size() const noexcept { return state_ ? state_->memory().size() : 0; }
RegionId RegionGuard::id() const noexcept { return state_ ? state_->region().id : RegionId{}; }
std::uint64_t RegionGuard::charged_bytes() const noexcept { return state_ ? state_->charged() : 0; }

const BackendRegion& RegionGuard::backend_region() const noexcept {
  static const BackendRegion empty{};
  return state_ ? state_->region() : empty;
}

RemoteRegion RegionGuard::remote() const {
  if (!state_) return {};
  return RemoteRegion{state_->backend()->wire_id(), state_->generation(),
                      reinterpret_cast<std::uint64_t>(state_->memory().data()),
                      state_->memory().size(), state_->region().packed_key};
}

DeregisteredEvent RegionGuard::deregistered() const {
  return DeregisteredEvent(state_ ? state_->deregistered() : nullptr);
}

void RegionGuard::do_transfer(std::shared_ptr<detail::RegionState> state, bool is_put, PeerId peer,
                              RemoteRegion remote, TransferRange range,
                              asio::any_completion_handler<void(Result<void>)> handler) {
  VoidCompletion completion(std::move(handler));
  if (!state) return completion.post(fail(errc::region_not_found, "empty region guard"));
  if (auto local = validate_slice(range.local_offset, range.len, state->memory().size()); !local) {
    return completion.post(std::move(local).error());
  }
  if (auto far = validate_slice(range.remote_offset, range.len, remote.len); !far) {
    return completion.post(std::move(far).error());
  }
  const auto& backend = state->backend();
  if (remote.backend != backend->wire_id()) {
    return completion.post(fail(errc::invalid_key,
                                "remote region belongs to backend " +
                                    std::to_string(static_cast<unsigned>(remote.backend)) + ", not " +
                                    std::string(backend->key())));
  }
  if (!state->begin_transfer()) {
    return completion.post(fail(errc::region_not_found, "region is being deregistered"));
  }
  TransferRequest request{peer, state->region().id, range.local_offset,
                          remote.addr + range.remote_offset, range.len, std::move(remote.packed_key)};
  auto slot = completion.cancellation_slot();
  // `backend` stays valid: the state, moved into the callback, keeps it.
  auto done = asio::bind_cancellation_slot(
      slot, [state = std::move(state), completion = std::move(completion)](Result<void> outcome) mutable {
        state->end_transfer();
        completion.dispatch(std::move(outcome));
      });
  if (is_put) {
    backend->async_put(std::move(request), std::move(done));
  } else {
    backend->async_get(std::move(request), std::move(done));
  }
}

void RegionGuard::do_deregister(const std::shared_ptr<detail::RegionState>& state,
                                asio::any_completion_handler<void(Result<void>)> handler) {
  auto completion = std::make_shared<VoidCompletion>(std::move(handler));
  if (!state) return completion->post(success());
  // The listener may run inside this call (the region was already released):
  // then it must post, never complete inline.
  auto initiating = std::make_shared<std::atomic<bool>>(true);
  state->request_deregistration([completion, initiating](const Result<void>& outcome) {
    if (initiating->load(std::memory_order_acquire)) {
      completion->post(outcome);
    } else {
      completion->dispatch(outcome);
    }
  });
  initiating->store(false, std::memory_order_release);
}

}  // namespace corma
