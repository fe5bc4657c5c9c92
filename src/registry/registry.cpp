#include <corma/registry.hpp>

#include "arena_core.hpp"
#include "registry_core.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>

namespace corma {

void outcome_throw_as_system_error_with_payload(const OwnedRegistrationFailure& f) {
  outcome_throw_as_system_error_with_payload(f.error);
}

Registry::Registry(std::shared_ptr<RdmaBackend> backend, RegistryConfig config)
    : core_(std::make_shared<detail::RegistryCore>(std::move(backend), config)) {}

Registry::Registry(Registry&&) noexcept = default;

Registry& Registry::operator=(Registry&& other) noexcept {
  if (this != &other) {
    if (core_) core_->registry_gone();
    core_ = std::move(other.core_);
  }
  return *this;
}

Registry::~Registry() {
  if (core_) core_->registry_gone();
}

namespace {

/// The caller's executor and cancellation slot, taken before the handler is
/// moved into an internal callback, so the core completes straight onto the
/// caller and the caller's cancellation reaches the backend.
class CallerBinding {
 public:
  template <class Handler>
  explicit CallerBinding(const Handler& handler)
      : slot_(asio::get_associated_cancellation_slot(handler)),
        executor_(asio::get_associated_executor(handler)) {}

  template <class Callback>
  auto bind(Callback callback) const {
    return asio::bind_cancellation_slot(slot_, asio::bind_executor(executor_, std::move(callback)));
  }

 private:
  asio::cancellation_slot slot_;
  asio::any_completion_executor executor_;
};

}  // namespace

void Registry::do_register(const Core& core, std::span<std::byte> memory, Access access, RegistrationOptions options,
                           asio::any_completion_handler<void(Result<RegionGuard>)> handler) {
  const CallerBinding caller(handler);
  auto done = caller.bind([h = std::move(handler)](Result<RegionGuard> r, OwnedBuffer) mutable {
    std::move(h)(std::move(r));
  });
  core->start_registration(memory, access, std::move(options), OwnedBuffer{}, std::move(done));
}

void Registry::do_register_owned(const Core& core, OwnedBuffer buffer, Access access,
                                 asio::any_completion_handler<void(OwnedResult)> handler) {
  const auto memory = buffer.bytes();
  const CallerBinding caller(handler);
  auto done = caller.bind([h = std::move(handler)](Result<RegionGuard> r, OwnedBuffer b) mutable {
    if (r) return std::move(h)(OwnedResult(std::move(r).value()));
    std::move(h)(OwnedResult(boost::outcome_v2::failure(
        OwnedRegistrationFailure{std::move(r).error(), std::move(b)})));
  });
  core->start_registration(memory, access, {}, std::move(buffer), std::move(done));
}

void Registry::do_invalidate(const Core& core, std::span<const std::byte> memory,
                             asio::any_completion_handler<void(Result<void>)> handler) {
  core->invalidate(memory, std::move(handler));
}

void Registry::do_make_arena(const Core& core, std::size_t bytes, ArenaConfig config,
                             asio::any_completion_handler<void(Result<Arena>)> handler) {
  auto capacity = detail::ArenaCore::capacity_for(bytes, config);
  if (!capacity) {
    return detail::Completion<void(Result<Arena>)>(std::move(handler))
        .post(core->backend()->progress_executor(), std::move(capacity).error());
  }
  const CallerBinding caller(handler);
  auto done = caller.bind([h = std::move(handler), config](Result<RegionGuard> r, OwnedBuffer) mutable {
    if (!r) return std::move(h)(std::move(r).error());
    std::move(h)(Arena(std::make_shared<detail::ArenaCore>(std::move(r).value(), config)));
  });
  auto buffer = OwnedBuffer::allocate(static_cast<std::size_t>(capacity.value()));
  const auto memory = buffer.bytes();
  core->start_registration(memory, config.access, {}, std::move(buffer), std::move(done));
}

void Registry::do_shutdown(const Core& core, std::chrono::steady_clock::duration deadline,
                           std::shared_ptr<asio::steady_timer> timer,
                           asio::any_completion_handler<void(Result<void>)> handler) {
  core->start_shutdown(deadline, std::move(timer), std::move(handler));
}

Result<RegionGuard> Registry::find_cached(std::span<std::byte> memory, Access access) {
  return core_->find_cached(memory, access);
}

RegistryStats Registry::stats() const { return core_->stats(); }

std::uint64_t Registry::charge_for(const void* ptr, std::size_t len) const noexcept {
  return core_->charge_for(ptr, len);
}

const std::shared_ptr<RdmaBackend>& Registry::backend() const noexcept { return core_->backend(); }

}  // namespace corma
