#include "region_state.hpp"

#include "registry_core.hpp"

#include <utility>

namespace corma::detail {

RegionState::RegionState(std::shared_ptr<RegistryCore> core, BackendRegion region,
                         std::span<std::byte> memory, std::uint64_t charged,
                         std::uint64_t generation, OwnedBuffer owned)
    : core_(std::move(core)),
      region_(std::move(region)),
      memory_(memory),
      charged_(charged),
      generation_(generation),
      owned_(std::move(owned)),
      deregistered_(std::make_shared<Latch>(core_->backend())) {}

RegionState::~RegionState() {
  if (owned_ && !released()) quarantine(std::move(owned_), core_->counters());
}

void RegionState::quarantine(OwnedBuffer buffer, RegistryCounters& counters) {
  static std::mutex mutex;
  static std::vector<std::byte*> parked;  // reachable on purpose: a leak, not a bug
  RegistryCounters::bump(counters.leaked_owned_buffers);
  std::lock_guard lock(mutex);
  parked.push_back(buffer.leak());
}

const std::shared_ptr<RdmaBackend>& RegionState::backend() const noexcept { return core_->backend(); }

RegistryCounters& RegionState::counters() const noexcept { return core_->counters(); }

bool RegionState::released() const {
  std::lock_guard lock(mutex_);
  return phase_ == Phase::released;
}

bool RegionState::unmapping() const {
  std::lock_guard lock(mutex_);
  return phase_ == Phase::unmapping;
}

OwnedBuffer RegionState::take_owned() {
  std::lock_guard lock(mutex_);
  return phase_ == Phase::released ? std::exchange(owned_, OwnedBuffer{}) : OwnedBuffer{};
}

bool RegionState::begin_transfer() {
  std::lock_guard lock(mutex_);
  if (phase_ != Phase::active) return false;
  ++transfers_in_flight_;
  return true;
}

void RegionState::end_transfer() {
  bool unmap = false;
  {
    std::lock_guard lock(mutex_);
    --transfers_in_flight_;
    if (phase_ == Phase::draining && transfers_in_flight_ == 0) {
      phase_ = Phase::unmapping;
      unmap = true;
    }
  }
  if (unmap) start_unmap();
}

void RegionState::request_deregistration(DeregistrationListener listener) {
  bool unmap = false;
  {
    std::unique_lock lock(mutex_);
    switch (phase_) {
      case Phase::released:
        lock.unlock();
        if (listener) listener(success());
        return;
      case Phase::active:
        phase_ = transfers_in_flight_ == 0 ? Phase::unmapping : Phase::draining;
        unmap = phase_ == Phase::unmapping;
        break;
      case Phase::unconfirmed:
        phase_ = Phase::unmapping;
        unmap = true;
        break;
      case Phase::draining:
      case Phase::unmapping:
        break;
    }
    if (listener) listeners_.push_back(std::move(listener));
  }
  if (unmap) start_unmap();
}

void RegionState::start_unmap() {
  backend()->async_unmap(region_.id, [self = shared_from_this()](Result<void> outcome) {
    self->on_unmapped(std::move(outcome));
  });
}

void RegionState::on_unmapped(Result<void> outcome) {
  std::vector<DeregistrationListener> listeners;
  bool already_released = false;
  {
    std::lock_guard lock(mutex_);
    already_released = phase_ == Phase::released;
    if (already_released) {
      // Shutdown confirmed the release while this unmap was out.
      outcome = success();
    } else {
      phase_ = outcome ? Phase::released : Phase::unconfirmed;
    }
    listeners.swap(listeners_);
  }
  if (!already_released) {
    if (outcome) {
      finish_release();
    } else {
      core_->on_region_unconfirmed(shared_from_this());
    }
  }
  for (auto& listener : listeners) listener(outcome);
}

void RegionState::confirm_released_by_shutdown() {
  std::vector<DeregistrationListener> listeners;
  {
    std::lock_guard lock(mutex_);
    if (phase_ == Phase::released) return;
    phase_ = Phase::released;
    listeners.swap(listeners_);
  }
  finish_release();
  for (auto& listener : listeners) listener(success());
}

void RegionState::finish_release() {
  // Budget first: whoever wakes on the latch may register again at once.
  core_->on_region_released(*this);
  deregistered_->set();
}

}  // namespace corma::detail
