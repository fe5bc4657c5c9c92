#include <corma/arena.hpp>

#include "arena_core.hpp"

namespace corma {

Arena::Arena() noexcept = default;
Arena::Arena(std::shared_ptr<detail::ArenaCore> core) noexcept : core_(std::move(core)) {}
Arena::Arena(Arena&&) noexcept = default;

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    if (core_) core_->close();
    core_ = std::move(other.core_);
  }
  return *this;
}

Arena::~Arena() {
  if (core_) core_->close();
}

Result<RegionGuard> Arena::allocate(std::size_t bytes) {
  if (!core_) return fail(errc::region_not_found, "empty arena");
  return core_->allocate(bytes);
}

void Arena::do_allocate(const std::shared_ptr<detail::ArenaCore>& core, std::size_t bytes,
                        asio::any_completion_handler<void(Result<RegionGuard>)> handler) {
  if (!core) {
    return detail::Completion<void(Result<RegionGuard>)>(std::move(handler))
        .post(fail(errc::region_not_found, "empty arena"));
  }
  core->allocate_or_wait(bytes, std::move(handler));
}

ArenaStats Arena::stats() const { return core_ ? core_->stats() : ArenaStats{}; }

const BackendRegion& Arena::backend_region() const noexcept {
  static const BackendRegion empty{};
  return core_ ? core_->backend_region() : empty;
}

}  // namespace corma
