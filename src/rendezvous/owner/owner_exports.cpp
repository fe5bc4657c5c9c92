// Registrations of objects for leases: the export cache, one registration
// per object at a time, and RDMA windows for objects larger than the budget.
#include "rendezvous/owner/owner_state.hpp"

#include <corma/descriptor.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <unistd.h>

#include <algorithm>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

asio::awaitable<Result<std::shared_ptr<Export>>> Owner::State::export_object(const std::string& name,
                                                                             const PublishedObject& object,
                                                                             bool cacheable) {
  for (;;) {
    if (auto ready = exports.ready(name, object)) co_return ready;
    const auto registered = exports.waiter(name);
    if (!registered) break;
    // Another acquire registers it now: its export is taken when ready
    // (or, if it failed or registered other bytes, this one tries in turn).
    (void)co_await registered->async_wait(asio::as_tuple(asio::use_awaitable));
  }
  const ExportTable::Registering under_way(exports, name);
  co_return co_await register_export(name, object, cacheable);
}

RegistrationOptions Owner::State::export_options(const PublishedObject& object, bool cacheable) const {
  if (!cacheable || !config.cache_exports) return RegistrationOptions{Caching::never, nullptr, nullptr};
  // Kept in the registry's cache between leases, with the bytes it pins.
  return RegistrationOptions{Caching::keep, object.keepalive, exports.eviction_counter()};
}

namespace {

/// Exports are registered read-only: peers may get from them, never put into them.
std::span<std::byte> exported_memory(const PublishedObject& object) {
  return {const_cast<std::byte*>(object.bytes.data()), object.bytes.size()};
}

}  // namespace

std::shared_ptr<Export> Owner::State::export_at_once(const std::string& name, const PublishedObject& object,
                                                     bool cacheable) {
  if (auto ready = exports.ready(name, object)) return ready;
  if (export_options(object, cacheable).caching != Caching::keep) return nullptr;
  auto guard = registry->find_cached(exported_memory(object), Access::remote_read);
  if (!guard) return nullptr;
  auto descriptor = describe(guard.value().remote());
  if (!descriptor) return nullptr;  // registered the slow way, which reports the error
  auto exported = std::make_shared<Export>(std::move(guard).value(), std::move(descriptor).value(), object.keepalive);
  exports.record(name, exported);
  return exported;
}

asio::awaitable<Result<std::shared_ptr<Export>>> Owner::State::register_export(const std::string& name,
                                                                               const PublishedObject& object,
                                                                               bool cacheable) {
  if (auto cached = export_at_once(name, object, cacheable)) co_return cached;
  const auto publication = publications.publication_of(name);
  std::span<std::byte> memory = exported_memory(object);
  auto options = export_options(object, cacheable);
  const bool kept = options.caching == Caching::keep;
  // The registry gives idle cached registrations back first when the budget needs room.
  auto guard = co_await registry->async_register(memory, Access::remote_read, std::move(options), asio::use_awaitable);
  if (!guard) co_return std::move(guard).error();
  ++stats.exports_registered;
  CORMA_CO_TRY(auto descriptor, describe(guard.value().remote()));
  auto exported = std::make_shared<Export>(std::move(guard).value(), std::move(descriptor), object.keepalive);
  if (publications.publication_of(name) == publication) {
    exports.record(name, exported);
  } else if (kept) {
    // Published again while this registered: the lease that asked reads
    // these bytes, but later acquires must not find them cached.
    registry->async_invalidate(memory, asio::detached);
  }
  co_return exported;
}

void Owner::State::forget_export(const std::string& name) {
  exports.forget(name);
  const auto* old = publications.find(name);
  // Nothing was registered without a registry (everything is served in chunks).
  if (old == nullptr || !config.cache_exports || !registry) return;
  // Its cached registration is shared no more; idle, it is deregistered now.
  registry->async_invalidate(old->bytes, asio::detached);
}

std::uint64_t Owner::State::window_length(const std::byte* start, std::uint64_t remaining, std::size_t sharers) const {
  const auto budget = registry->stats();
  const auto used = budget.registered_bytes + budget.reserved_bytes;
  const auto left = budget.budget_bytes > used ? budget.budget_bytes - used : 0;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  auto share = std::min<std::uint64_t>(left, budget.budget_bytes / (sharers + 1));
  if (reinterpret_cast<std::uintptr_t>(start) % page != 0) share = share > page ? share - page : 0;
  share -= share % page;
  share = std::clamp<std::uint64_t>(share, config.min_window, std::max(config.max_window, config.min_window));
  return std::min(share, remaining);
}

asio::awaitable<Result<std::shared_ptr<Export>>> Owner::State::export_window(const PublishedObject& object,
                                                                             std::uint64_t offset,
                                                                             std::size_t sharers) {
  const std::uint64_t remaining = object.bytes.size() - offset;
  std::uint64_t len = window_length(object.bytes.data() + offset, remaining, sharers);
  const std::uint64_t smallest = std::min<std::uint64_t>(std::max<std::uint64_t>(config.min_window, 1), remaining);
  for (;;) {
    std::span<std::byte> memory(const_cast<std::byte*>(object.bytes.data()) + offset, len);
    auto guard = co_await registry->async_register(memory, Access::remote_read,
                                                   RegistrationOptions{Caching::never, nullptr, nullptr},
                                                   asio::use_awaitable);
    if (guard) {
      CORMA_CO_TRY(auto descriptor, describe(guard.value().remote()));
      ++stats.windows;
      co_return std::make_shared<Export>(std::move(guard).value(), std::move(descriptor), object.keepalive);
    }
    if (!guard.error().is(errc::budget_exceeded) || len <= smallest) co_return std::move(guard).error();
    // The registry gave idle cached registrations back before it refused:
    // what is left now, or half as much.
    len = std::max(smallest, std::min(len / 2, window_length(object.bytes.data() + offset, remaining, sharers)));
  }
}

asio::awaitable<Message> Owner::State::next_window(std::uint64_t session, NextWindow request) {
  Lease* lease = leases.held(session, request.lease);
  if (lease == nullptr) {
    ++stats.refused_requests;
    co_return error_reply(Error{errc::region_not_found, "no such lease on this connection"});
  }
  if (!lease->windowed) {
    ++stats.refused_requests;
    co_return error_reply(Error{errc::out_of_range, "this lease is not lent in windows"});
  }
  const auto size = lease->object.bytes.size();
  // Forward only: the next window starts where the current one ends, or
  // further on (a consumer reading a byte range skips what it does not need).
  if (request.offset < lease->window_end || request.offset >= size) {
    ++stats.refused_requests;
    co_return error_reply(Error{errc::out_of_range, "windows move forward: the next one starts at or after " +
                                                        std::to_string(lease->window_end) + " of " +
                                                        std::to_string(size)});
  }
  if (lease->moving) {
    ++stats.refused_requests;
    co_return error_reply(Error{errc::out_of_range, "this lease's next window is being registered already"});
  }
  leases.renew(*lease);
  lease->moving = true;
  const auto object = lease->object;
  if (auto current = std::move(lease->exported); current) {
    (void)co_await current->guard.async_deregister(asio::use_awaitable);
  }
  auto window = co_await export_window(object, request.offset, std::max<std::size_t>(leases.windowed(), 1));
  // The lease may have gone meanwhile (released, reaped, or its connection closed).
  lease = leases.held(session, request.lease);
  if (lease == nullptr) co_return error_reply(Error{errc::region_not_found, "the lease ended meanwhile"});
  lease->moving = false;
  if (!window) co_return error_reply(std::move(window).error());
  lease->exported = std::move(window).value();
  lease->window_end = request.offset + lease->exported->guard.size();
  leases.renew(*lease);
  co_return RdmaWindow{request.lease,
                       size,
                       static_cast<std::uint32_t>(config.lease_timeout.count()),
                       request.offset,
                       lease->exported->guard.size(),
                       lease->exported->descriptor,
                       lease->generation};
}

}  // namespace corma
