#include <corma/owner.hpp>

#include "answer_queue.hpp"
#include "framed_connection.hpp"
#include "hello.hpp"

#include <corma/descriptor.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <unistd.h>

#include <list>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;
using clock_type = std::chrono::steady_clock;

namespace {

/// One registration of an object, shared by every lease that reads it (and
/// by the export cache, for published objects).
struct Export {
  Export(RegionGuard g, std::vector<std::byte> d, std::shared_ptr<const void> k)
      : guard(std::move(g)), descriptor(std::move(d)), keepalive(std::move(k)) {}
  Export(const Export&) = delete;
  Export& operator=(const Export&) = delete;
  ~Export() {
    // The bytes must outlive their registration: they are let go once the
    // deregistration that dropping the guard starts is confirmed.
    if (keepalive && !guard.deregistered().is_set()) {
      guard.deregistered().async_wait([keep = std::move(keepalive)](Result<void>) {});
    }
  }

  RegionGuard guard;
  std::vector<std::byte> descriptor;
  std::shared_ptr<const void> keepalive;
};

struct Lease {
  std::uint64_t session = 0;
  std::string name;
  PublishedObject object;
  /// For published objects: the publication this lease reads. A release after
  /// the name was published again answers `object_changed`.
  std::optional<std::uint64_t> publication;
  std::shared_ptr<Export> exported;  // empty for chunked leases; the current window for windowed ones
  clock_type::time_point deadline;
  /// Lent in windows (protocol version 2): `exported` registers
  /// [window_end - its length, window_end) of the object.
  bool windowed = false;
  std::uint64_t window_end = 0;
  /// A next_window is registering this lease's next window now.
  bool moving = false;
};

ErrorReply error_reply(const Error& error) {
  return ErrorReply{static_cast<std::uint16_t>(error.code.value()), error.detail.substr(0, max_detail_length)};
}

ChunkedReason reason_for(const Error& error) {
  if (error.is(errc::budget_exceeded)) return ChunkedReason::budget;
  if (error.is(errc::not_configured)) return ChunkedReason::not_configured;
  if (error.is(errc::shutting_down)) return ChunkedReason::draining;
  return ChunkedReason::registration_failed;
}

}  // namespace

struct Owner::State : std::enable_shared_from_this<State> {
  asio::any_io_executor executor;
  std::shared_ptr<Registry> registry;
  OwnerConfig config;

  std::map<std::string, PublishedObject, std::less<>> published;
  /// How many times each name was published: a lease remembers the count
  /// it read, so its release can tell whether the object changed meanwhile.
  std::map<std::string, std::uint64_t, std::less<>> publications;
  ObjectResolver resolver;
  std::map<std::uint64_t, Lease> leases;
  /// The leases of each connection, so that counting and dropping them
  /// never scans every lease.
  std::unordered_map<std::uint64_t, std::unordered_set<std::uint64_t>> session_leases;
  std::size_t handshakes = 0;  // connections that have not finished their hello
  std::size_t windowed_leases = 0;  // leases lent in windows now: they share the budget
  /// Exports whose leases stop() dropped, kept (registered, bytes alive)
  /// until the Owner goes: see Owner::stop().
  std::vector<std::shared_ptr<Export>> retired;
  std::map<std::string, std::weak_ptr<Export>, std::less<>> exports;
  /// Published objects kept registered between leases (config.cache_exports),
  /// least recently used first, and where each name is in that list.
  using CachedExports = std::list<std::pair<std::string, std::shared_ptr<Export>>>;
  CachedExports cached_exports;
  std::unordered_map<std::string, CachedExports::iterator> cached_by_name;
  /// Registrations of objects under way, by name: an acquire of an object
  /// being registered waits for that registration instead of making its own
  /// (the timer never expires; it is cancelled when the registration ends).
  std::map<std::string, std::shared_ptr<asio::steady_timer>, std::less<>> exporting;
  /// Acquires under way, per connection and in all: a connection's requests
  /// are worked on concurrently, and these count against the lease caps
  /// until they end.
  std::unordered_map<std::uint64_t, std::size_t> acquiring;
  std::size_t acquiring_total = 0;
  std::set<std::shared_ptr<FramedConnection>> connections;
  std::uint64_t next_lease = 1;
  std::uint64_t next_session = 1;
  bool draining = false;
  OwnerStats stats;
  asio::steady_timer reaper;

  State(asio::any_io_executor ex, std::shared_ptr<Registry> r, OwnerConfig c)
      : executor(ex), registry(std::move(r)), config(c), reaper(ex) {}

  Result<PublishedObject> find(std::string_view name) {
    if (auto it = published.find(name); it != published.end()) return it->second;
    if (resolver) return resolver(name);
    return fail(errc::region_not_found, "no object named '" + std::string(name) + "'");
  }

  /// Leases `session` holds, and acquires it has under way.
  std::size_t leases_of(std::uint64_t session) const {
    auto it = session_leases.find(session);
    auto under_way = acquiring.find(session);
    return (it == session_leases.end() ? 0 : it->second.size()) +
           (under_way == acquiring.end() ? 0 : under_way->second);
  }

  /// An acquire under way, counted against the lease caps while it lasts.
  struct AcquireUnderWay {
    State& state;
    std::uint64_t session;
    AcquireUnderWay(State& s, std::uint64_t id) : state(s), session(id) {
      ++state.acquiring[session];
      ++state.acquiring_total;
    }
    AcquireUnderWay(const AcquireUnderWay&) = delete;
    AcquireUnderWay& operator=(const AcquireUnderWay&) = delete;
    ~AcquireUnderWay() {
      if (--state.acquiring[session] == 0) state.acquiring.erase(session);
      --state.acquiring_total;
    }
  };

  void add_lease(std::uint64_t id, Lease lease) {
    session_leases[lease.session].insert(id);
    leases.emplace(id, std::move(lease));
  }

  std::map<std::uint64_t, Lease>::iterator erase_lease(std::map<std::uint64_t, Lease>::iterator it) {
    if (it->second.windowed) --windowed_leases;
    if (auto owner = session_leases.find(it->second.session); owner != session_leases.end()) {
      owner->second.erase(it->first);
      if (owner->second.empty()) session_leases.erase(owner);
    }
    return leases.erase(it);
  }

  /// Whether `lease` reads an object that was published again since.
  bool republished_since(const Lease& lease) const {
    if (!lease.publication) return false;
    auto it = publications.find(lease.name);
    return it == publications.end() || it->second != *lease.publication;
  }

  Lease* lease_of(std::uint64_t session, std::uint64_t id) {
    auto it = leases.find(id);
    if (it == leases.end() || it->second.session != session) return nullptr;
    return &it->second;
  }

  void refresh(Lease& lease) { lease.deadline = clock_type::now() + config.lease_timeout; }

  std::shared_ptr<Export> cached_export(const std::string& name) {
    auto found = cached_by_name.find(name);
    if (found == cached_by_name.end()) return nullptr;
    cached_exports.splice(cached_exports.end(), cached_exports, found->second);  // most recently used last
    return found->second->second;
  }

  void cache_export(const std::string& name, std::shared_ptr<Export> exported) {
    cached_exports.emplace_back(name, std::move(exported));
    cached_by_name[name] = std::prev(cached_exports.end());
  }

  void forget_cached_export(const std::string& name) {
    auto found = cached_by_name.find(name);
    if (found == cached_by_name.end()) return;
    cached_exports.erase(found->second);
    cached_by_name.erase(found);
  }

  void forget_cached_exports() {
    cached_exports.clear();
    cached_by_name.clear();
  }

  /// Deregisters cached exports that no lease is reading; true if any went.
  /// Awaited, so their bytes are back in the budget when this returns.
  asio::awaitable<bool> evict_idle_exports() {
    std::vector<std::shared_ptr<Export>> idle;
    for (auto it = cached_exports.begin(); it != cached_exports.end();) {
      if (it->second.use_count() == 1) {
        // Not handed out again while its deregistration runs.
        if (auto live = exports.find(it->first); live != exports.end() && live->second.lock() == it->second) {
          exports.erase(live);
        }
        idle.push_back(std::move(it->second));
        cached_by_name.erase(it->first);
        it = cached_exports.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& exported : idle) {
      (void)co_await exported->guard.async_deregister(asio::use_awaitable);
      ++stats.exports_evicted;
    }
    co_return !idle.empty();
  }

  std::uint64_t publication_of(std::string_view name) const {
    auto it = publications.find(name);
    return it == publications.end() ? 0 : it->second;
  }

  /// Whether `exported` registers exactly `object`'s bytes (a name may
  /// have been published again, or its file changed, since).
  static bool covers(const Export& exported, const PublishedObject& object) {
    const auto registered = exported.guard.bytes();
    return registered.data() == object.bytes.data() && registered.size() == object.bytes.size();
  }

  /// A registration of `name` under way; its waiters are woken however it ends.
  struct ExportUnderWay {
    State& state;
    std::string name;
    std::shared_ptr<asio::steady_timer> done;
    ExportUnderWay(State& s, std::string n)
        : state(s), name(std::move(n)),
          done(std::make_shared<asio::steady_timer>(s.executor, asio::steady_timer::time_point::max())) {
      state.exporting.emplace(name, done);
    }
    ExportUnderWay(const ExportUnderWay&) = delete;
    ExportUnderWay& operator=(const ExportUnderWay&) = delete;
    ~ExportUnderWay() {
      state.exporting.erase(name);
      done->cancel();
    }
  };

  /// The registration of `object` that leases of `name` read: the cached
  /// or live one, or a new one (one at a time per name).
  asio::awaitable<Result<std::shared_ptr<Export>>> export_object(const std::string& name,
                                                                  const PublishedObject& object, bool cacheable) {
    for (;;) {
      if (auto cached = cached_export(name); cached && covers(*cached, object)) co_return cached;
      if (auto it = exports.find(name); it != exports.end()) {
        if (auto shared = it->second.lock(); shared && covers(*shared, object)) co_return shared;
      }
      auto under_way = exporting.find(name);
      if (under_way == exporting.end()) break;
      // Another acquire registers it now: its export is taken when ready
      // (or, if it failed or registered other bytes, this one tries in turn).
      const auto registered = under_way->second;
      (void)co_await registered->async_wait(asio::as_tuple(asio::use_awaitable));
    }
    const ExportUnderWay under_way(*this, name);
    co_return co_await register_export(name, object, cacheable);
  }

  asio::awaitable<Result<std::shared_ptr<Export>>> register_export(const std::string& name,
                                                                    const PublishedObject& object, bool cacheable) {
    const auto publication = publication_of(name);
    // Registered read-only: peers may get from it, never put into it.
    std::span<std::byte> memory(const_cast<std::byte*>(object.bytes.data()), object.bytes.size());
    auto guard = co_await registry->async_register(memory, Access::remote_read, asio::use_awaitable);
    if (!guard && guard.error().is(errc::budget_exceeded) && co_await evict_idle_exports()) {
      guard = co_await registry->async_register(memory, Access::remote_read, asio::use_awaitable);
    }
    if (!guard) co_return std::move(guard).error();
    CORMA_CO_TRY(auto descriptor, describe(guard.value().remote()));
    auto exported = std::make_shared<Export>(std::move(guard).value(), encode(descriptor), object.keepalive);
    ++stats.exports_registered;
    // Published again while this registered: the lease that asked reads
    // these bytes, but later acquires must not.
    if (publication_of(name) == publication) {
      exports[name] = exported;
      if (cacheable && config.cache_exports) {
        forget_cached_export(name);
        cache_export(name, exported);
      }
    }
    co_return exported;
  }

  /// `windows`: the consumer speaks version 2, so an object whose
  /// registration does not fit the budget may be lent in windows.
  asio::awaitable<Grant> acquire(std::uint64_t session, bool rdma_peer, bool windows, Acquire request) {
    auto object = find(request.name);
    if (!object) {
      if (object.error().is(errc::region_not_found)) {
        ++stats.not_found;
        co_return NotFound{};
      }
      co_return error_reply(object.error());
    }
    if (leases_of(session) >= config.max_leases_per_connection) {
      ++stats.refused_requests;
      co_return error_reply(Error{errc::budget_exceeded, "too many leases on this connection"});
    }
    if (leases.size() + acquiring_total >= config.max_leases) {
      ++stats.refused_requests;
      co_return error_reply(Error{errc::budget_exceeded, "the owner holds its maximum of " +
                                                             std::to_string(config.max_leases) + " leases"});
    }
    const AcquireUnderWay under_way(*this, session);
    const std::uint64_t size = object.value().bytes.size();
    Lease lease{session, request.name, object.value(), std::nullopt, nullptr, {}};
    if (auto it = publications.find(request.name); it != publications.end() && published.contains(request.name)) {
      lease.publication = it->second;
    }
    std::optional<ChunkedReason> reason;
    if (draining) {
      reason = ChunkedReason::draining;
    } else if (!request.wants_rdma || !rdma_peer) {
      reason = ChunkedReason::no_offer;
    } else if (size < config.rdma_threshold) {
      reason = ChunkedReason::below_threshold;
    } else {
      const bool cacheable = published.find(request.name) != published.end();
      auto exported = co_await export_object(request.name, lease.object, cacheable);
      if (exported) {
        lease.exported = std::move(exported).value();
      } else if (windows && exported.error().is(errc::budget_exceeded)) {
        auto window = co_await export_window(lease.object, 0, windowed_leases + 1);
        if (window) {
          lease.exported = std::move(window).value();
          lease.windowed = true;
          lease.window_end = lease.exported->guard.size();
        } else {
          reason = window.error().is(errc::budget_exceeded) ? ChunkedReason::no_window : reason_for(window.error());
        }
      } else {
        reason = reason_for(exported.error());
      }
    }
    const std::uint64_t id = next_lease++;
    refresh(lease);
    const auto timeout_ms = static_cast<std::uint32_t>(config.lease_timeout.count());
    if (reason) {
      ++stats.decisions.chunked_by_reason[std::string(to_string(*reason))];
      add_lease(id, std::move(lease));
      co_return Chunked{id, size, config.chunk_size, timeout_ms, *reason};
    }
    ++stats.decisions.rdma;
    auto descriptor = lease.exported->descriptor;
    if (lease.windowed) {
      ++windowed_leases;
      const auto window_len = lease.window_end;
      add_lease(id, std::move(lease));
      co_return RdmaWindow{id, size, timeout_ms, 0, window_len, std::move(descriptor)};
    }
    add_lease(id, std::move(lease));
    co_return RdmaGrant{id, size, timeout_ms, std::move(descriptor)};
  }

  /// The length of a window starting at `start`, for one of `sharers`
  /// leases lent in windows now: the budget split in `sharers + 1` shares
  /// (one kept free, so a newcomer finds room and the shares shrink as
  /// each lease moves on), within what is left, [min_window, max_window],
  /// and never past the object's end. The budget charges whole pages, so a
  /// window is a whole number of pages, less one when it starts off a page
  /// boundary.
  std::uint64_t window_length(const std::byte* start, std::uint64_t remaining, std::size_t sharers) const {
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

  /// Registers the window of `object` starting at `offset` (read-only, for
  /// this lease alone): as long as window_length() says, shorter when that
  /// does not fit (idle cached exports are given up first), down to
  /// min_window. `budget_exceeded` when not even that fits.
  asio::awaitable<Result<std::shared_ptr<Export>>> export_window(const PublishedObject& object,
                                                                  std::uint64_t offset, std::size_t sharers) {
    const std::uint64_t remaining = object.bytes.size() - offset;
    std::uint64_t len = window_length(object.bytes.data() + offset, remaining, sharers);
    const std::uint64_t smallest = std::min<std::uint64_t>(std::max<std::uint64_t>(config.min_window, 1), remaining);
    for (;;) {
      std::span<std::byte> memory(const_cast<std::byte*>(object.bytes.data()) + offset, len);
      auto guard = co_await registry->async_register(memory, Access::remote_read, asio::use_awaitable);
      if (guard) {
        CORMA_CO_TRY(auto descriptor, describe(guard.value().remote()));
        ++stats.windows;
        co_return std::make_shared<Export>(std::move(guard).value(), encode(descriptor), object.keepalive);
      }
      if (!guard.error().is(errc::budget_exceeded)) co_return std::move(guard).error();
      if (co_await evict_idle_exports()) {
        len = window_length(object.bytes.data() + offset, remaining, sharers);  // with the room given back
        continue;
      }
      if (len <= smallest) co_return std::move(guard).error();
      len = std::max(smallest, len / 2);
    }
  }

  /// Moves a windowed lease's window forward to start where the current one
  /// ends: the current window is deregistered first (its bytes back in the
  /// budget), then the next registered. Asked out of order, past the end,
  /// or on a lease not lent in windows, it is refused and the lease kept.
  asio::awaitable<Message> next_window(std::uint64_t session, NextWindow request) {
    Lease* lease = lease_of(session, request.lease);
    if (lease == nullptr) {
      ++stats.refused_requests;
      co_return error_reply(Error{errc::region_not_found, "no such lease on this connection"});
    }
    if (!lease->windowed) {
      ++stats.refused_requests;
      co_return error_reply(Error{errc::out_of_range, "this lease is not lent in windows"});
    }
    const auto size = lease->object.bytes.size();
    if (request.offset != lease->window_end || request.offset >= size) {
      ++stats.refused_requests;
      co_return error_reply(Error{errc::out_of_range, "windows move forward: the next one starts at " +
                                                          std::to_string(lease->window_end) + " of " +
                                                          std::to_string(size)});
    }
    if (lease->moving) {
      ++stats.refused_requests;
      co_return error_reply(Error{errc::out_of_range, "this lease's next window is being registered already"});
    }
    refresh(*lease);
    lease->moving = true;
    const auto object = lease->object;
    if (auto current = std::move(lease->exported); current) {
      (void)co_await current->guard.async_deregister(asio::use_awaitable);
    }
    auto window = co_await export_window(object, request.offset, std::max<std::size_t>(windowed_leases, 1));
    // The lease may have gone meanwhile (released, reaped, or its connection closed).
    lease = lease_of(session, request.lease);
    if (lease == nullptr) co_return error_reply(Error{errc::region_not_found, "the lease ended meanwhile"});
    lease->moving = false;
    if (!window) co_return error_reply(std::move(window).error());
    lease->exported = std::move(window).value();
    lease->window_end = request.offset + lease->exported->guard.size();
    refresh(*lease);
    co_return RdmaWindow{request.lease, size, static_cast<std::uint32_t>(config.lease_timeout.count()),
                         request.offset, lease->exported->guard.size(), lease->exported->descriptor};
  }

  /// The slice a pull asks for, checked against its lease, with the
  /// object's keepalive: it is written straight from there, and must outlive
  /// the write even if the lease goes meanwhile.
  Result<PublishedObject> pull(std::uint64_t session, const Pull& request) {
    Lease* lease = lease_of(session, request.lease);
    if (lease == nullptr) {
      ++stats.refused_requests;
      return Error{errc::region_not_found, "no such lease on this connection"};
    }
    if (request.len > config.chunk_size) {
      ++stats.refused_requests;
      return Error{errc::out_of_range, "pull larger than the chunk size"};
    }
    // Nothing outside the published range is ever sent.
    if (auto inside = validate_slice(request.offset, request.len, lease->object.bytes.size()); !inside) {
      ++stats.refused_requests;
      return std::move(inside).error();
    }
    refresh(*lease);
    ++stats.pulls;
    stats.pulled_bytes += request.len;
    return PublishedObject{lease->object.bytes.subspan(request.offset, request.len), lease->object.keepalive};
  }

  Message renew(std::uint64_t session, const Renew& request) {
    Lease* lease = lease_of(session, request.lease);
    if (lease == nullptr) {
      ++stats.refused_requests;
      return error_reply(Error{errc::region_not_found, "no such lease on this connection"});
    }
    refresh(*lease);
    return Renewed{static_cast<std::uint32_t>(config.lease_timeout.count())};
  }

  /// Ends the lease. A consumer reports success only after this answer: it
  /// is `object_changed` when the object was published again while the
  /// lease read it, so the consumer never reports a possible mix.
  Message release(std::uint64_t session, const Release& request) {
    Lease* lease = lease_of(session, request.lease);
    if (lease == nullptr) return Released{};
    const bool changed = republished_since(*lease);
    erase_lease(leases.find(request.lease));
    ++stats.leases_released;
    if (changed) return error_reply(Error{errc::object_changed, "the object was published again during the lease"});
    return Released{};
  }

  void drop_leases_of(std::uint64_t session) {
    auto owned = session_leases.find(session);
    if (owned == session_leases.end()) return;
    for (auto id : owned->second) {
      if (auto it = leases.find(id); it != leases.end()) {
        if (it->second.windowed) --windowed_leases;
        leases.erase(it);
      }
    }
    session_leases.erase(owned);
  }

  /// What a finished hello leaves a session with.
  struct Greeting {
    bool ok = false;                  ///< hello_ok was sent: serve the connection
    std::optional<PeerId> peer;       ///< the consumer's RDMA peer, when its offer was taken
    std::uint16_t version = 0;        ///< the protocol version both sides speak
  };

  /// The batch limit told to consumers: within what one answer frame holds,
  /// and half the lease cap, so a consumer may have two batches leased at
  /// once (one being read while the next is granted).
  std::uint16_t announced_batch() const {
    const std::size_t half_the_leases = std::max<std::size_t>(config.max_leases_per_connection / 2, 1);
    return static_cast<std::uint16_t>(
        std::clamp<std::size_t>(std::min(config.max_batch_objects, half_the_leases), 1, max_grants_per_frame));
  }

  asio::awaitable<Greeting> handshake(FramedConnection& connection) {
    Greeting greeting;
    auto first = co_await connection.read(config.io_timeout, config.io_timeout);
    if (!first || !std::holds_alternative<Hello>(first.value().message)) {
      ++stats.refused_requests;
      co_return greeting;
    }
    auto answered = co_await answer_hello(registry ? registry->backend().get() : nullptr,
                                          std::move(std::get<Hello>(first.value().message)), announced_batch());
    // A refused hello (an unsupported version) is a refused request.
    auto* ok = std::get_if<HelloOk>(&answered.reply);
    if (ok == nullptr) ++stats.refused_requests;
    greeting.version = ok != nullptr ? ok->version : 0;
    greeting.peer = answered.peer;
    Frame reply{first.value().request_id, std::move(answered.reply)};
    const bool written = static_cast<bool>(co_await connection.write(reply, config.io_timeout));
    greeting.ok = written && ok != nullptr;
    co_return greeting;
  }

  /// Counts a batch request of `size` elements, or refuses it when it is
  /// over the limit announced in the hello.
  std::optional<ErrorReply> admit_batch(std::size_t size) {
    if (size > announced_batch()) {
      ++stats.refused_requests;
      return error_reply(Error{errc::budget_exceeded, "a batch of " + std::to_string(size) +
                                                          " elements exceeds this owner's limit of " +
                                                          std::to_string(announced_batch())});
    }
    ++stats.batch_requests;
    return std::nullopt;
  }

  /// Acquires every name of a batch, each answered as a single acquire
  /// would be. A batch over the limit announced in the hello is refused
  /// whole, before any name is looked at.
  asio::awaitable<Message> acquire_many(std::uint64_t session, bool rdma_peer, AcquireMany request) {
    if (auto refused = admit_batch(request.names.size())) co_return std::move(*refused);
    Granted granted;
    granted.grants.reserve(request.names.size());
    for (auto& name : request.names) {
      // Named, not a temporary inside the co_await: g++ 12 destroys those twice.
      Acquire single{std::move(name), request.wants_rdma};
      granted.grants.push_back(co_await acquire(session, rdma_peer, true, std::move(single)));
    }
    co_return granted;
  }

  /// Ends every lease of a batch, each answered as a single release would
  /// be; a lease this connection does not hold is named, and left alone.
  Message release_many(std::uint64_t session, const ReleaseMany& request) {
    if (auto refused = admit_batch(request.leases.size())) return std::move(*refused);
    ReleasedMany released;
    released.codes.reserve(request.leases.size());
    for (auto lease : request.leases) {
      if (lease_of(session, lease) == nullptr) {
        ++stats.refused_requests;
        released.codes.push_back(static_cast<std::uint16_t>(errc::region_not_found));
        continue;
      }
      auto answer = release(session, Release{lease});
      const auto* error = std::get_if<ErrorReply>(&answer);
      released.codes.push_back(error != nullptr ? error->code : 0);
    }
    return released;
  }

  /// What a connection's requests need to know of it.
  struct Session {
    std::uint64_t id = 0;
    bool rdma_peer = false;  ///< the consumer's RDMA offer was taken
    bool version2 = false;   ///< batches and windows
  };

  /// Whether answering `message` may wait for registrations (acquires and
  /// windows): those are worked on concurrently with the connection's other
  /// requests.
  static bool registers(const Session& session, const Message& message) {
    return std::holds_alternative<Acquire>(message) ||
           (session.version2 && (std::holds_alternative<AcquireMany>(message) ||
                                 std::holds_alternative<NextWindow>(message)));
  }

  asio::awaitable<Message> registering_answer(const Session& session, Message message) {
    if (auto* acquire_request = std::get_if<Acquire>(&message)) {
      auto grant = co_await acquire(session.id, session.rdma_peer, session.version2, std::move(*acquire_request));
      co_return std::visit([](auto&& answer) { return Message{std::move(answer)}; }, std::move(grant));
    }
    if (auto* many = std::get_if<AcquireMany>(&message)) {
      co_return co_await acquire_many(session.id, session.rdma_peer, std::move(*many));
    }
    co_return co_await next_window(session.id, std::get<NextWindow>(message));
  }

  /// Answers a registering request in the background, `self` keeping the
  /// state alive. `answers` outlives it: the connection waits for every
  /// request it took.
  asio::awaitable<void> answer_concurrently([[maybe_unused]] std::shared_ptr<State> self, Session session, AnswerQueue& answers,
                                            Frame frame) {
    Message reply;
    try {
      reply = co_await registering_answer(session, std::move(frame.message));
    } catch (const std::exception& e) {
      // (A resolver that throws, say.) The request is answered all the
      // same: the connection waits for every answer it owes.
      reply = error_reply(Error{errc::backend, std::string("the owner failed to answer: ") + e.what()});
    }
    Frame response{frame.request_id, std::move(reply)};
    co_await answers.answer(std::move(response));
  }

  /// Takes one request (already begun in `answers`): what needs no waiting
  /// is answered now, in order; the rest runs concurrently. False when the
  /// connection ends after this answer (a consumer sent an owner message).
  asio::awaitable<bool> take(const Session& session, AnswerQueue& answers, Frame frame) {
    const auto request_id = frame.request_id;
    auto& message = frame.message;
    if (registers(session, message)) {
      asio::co_spawn(executor, answer_concurrently(shared_from_this(), session, answers, std::move(frame)),
                     asio::detached);
      co_return true;
    }
    Message reply = ErrorReply{static_cast<std::uint16_t>(errc::protocol), "unexpected message"};
    bool hostile = false;
    if (auto* pull_request = std::get_if<Pull>(&message)) {
      auto slice = pull(session.id, *pull_request);
      if (slice) {
        co_await answers.answer_data(request_id, pull_request->offset, slice.value().bytes,
                                     std::move(slice.value().keepalive));
        co_return true;
      }
      reply = error_reply(std::move(slice).error());
    } else if (auto* renew_request = std::get_if<Renew>(&message)) {
      reply = renew(session.id, *renew_request);
    } else if (auto* release_request = std::get_if<Release>(&message)) {
      reply = release(session.id, *release_request);
    } else if (auto* to_release = std::get_if<ReleaseMany>(&message); to_release != nullptr && session.version2) {
      reply = release_many(session.id, *to_release);
    } else if (std::holds_alternative<AcquireMany>(message) || std::holds_alternative<ReleaseMany>(message) ||
               std::holds_alternative<NextWindow>(message)) {
      ++stats.refused_requests;  // a version 1 session: answered, the connection kept
      reply = ErrorReply{static_cast<std::uint16_t>(errc::protocol), "this request needs protocol version 2"};
    } else {
      hostile = true;  // a consumer never sends owner messages
      ++stats.refused_requests;
    }
    Frame response{request_id, std::move(reply)};
    co_await answers.answer(std::move(response));
    co_return !hostile;
  }

  asio::awaitable<void> session(asio::ip::tcp::socket socket) {
    auto self = shared_from_this();
    auto connection = std::make_shared<FramedConnection>(std::move(socket), default_max_frame_body);
    connections.insert(connection);
    ++stats.connections;
    const std::uint64_t session_id = next_session++;
    ++handshakes;
    const auto greeting = co_await handshake(*connection);
    --handshakes;
    const auto& peer = greeting.peer;
    const Session session{session_id, peer.has_value(), greeting.version >= batch_protocol_version};
    AnswerQueue answers(*connection, config.io_timeout);
    const auto in_flight = std::max<std::size_t>(config.max_requests_in_flight, 1);
    for (std::uint64_t served = 1; greeting.ok && connection->is_open() && !answers.failed(); ++served) {
      // Frames already buffered are read without suspending: give the other
      // connections their turn now and then, so that one client streaming
      // requests cannot hold the owner.
      if (served % 8 == 0) co_await asio::post(executor, asio::use_awaitable);
      co_await answers.until_below(in_flight);
      if (!connection->is_open()) break;
      auto frame = co_await connection->read(config.idle_timeout, config.io_timeout);
      if (!frame) {
        if (frame.error().is(errc::protocol)) ++stats.refused_requests;
        break;
      }
      answers.begin();
      if (!co_await take(session, answers, std::move(frame).value())) break;
    }
    // Every request taken is answered (or its answer dropped with the
    // connection) before the session's leases and peer go.
    co_await answers.until_below(1);
    connection->close();
    connections.erase(connection);
    drop_leases_of(session_id);
    if (peer && registry) {
      (void)co_await registry->backend()->async_peer_close(*peer, asio::use_awaitable);
    }
  }

  /// Turns a connection away with one `budget_exceeded` frame, written
  /// without waiting (a fresh socket's send buffer takes it whole), and closes it.
  void refuse(asio::ip::tcp::socket& socket) {
    ++stats.refused_connections;
    const auto bytes = encode_frame(Frame{0, error_reply(Error{errc::budget_exceeded, "too many connections"})});
    boost::system::error_code ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(bytes), ignored);
    socket.close(ignored);
  }

  asio::awaitable<void> reap() {
    auto self = shared_from_this();
    while (!draining) {
      reaper.expires_after(config.reap_interval);
      auto [ec] = co_await reaper.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) break;
      const auto now = clock_type::now();
      for (auto it = leases.begin(); it != leases.end();) {
        if (it->second.deadline < now) {
          it = erase_lease(it);
          ++stats.leases_expired;
        } else {
          ++it;
        }
      }
    }
  }
};

Owner::Owner(asio::any_io_executor executor, std::shared_ptr<Registry> registry, OwnerConfig config)
    : state_(std::make_shared<State>(executor, std::move(registry), config)) {
  asio::co_spawn(executor, state_->reap(), asio::detached);
}

Owner::~Owner() { stop(); }

void Owner::publish(std::string name, PublishedObject object) {
  // New bytes under an old name: the old export must not be handed out again.
  state_->forget_cached_export(name);
  state_->exports.erase(name);
  ++state_->publications[name];
  state_->published[std::move(name)] = std::move(object);
}

void Owner::set_resolver(ObjectResolver resolver) { state_->resolver = std::move(resolver); }

asio::any_io_executor Owner::executor() const { return state_->executor; }

asio::awaitable<void> Owner::accept_loop(asio::ip::tcp::acceptor& acceptor) {
  auto state = state_;
  while (!state->draining) {
    auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
      continue;  // a failed accept (out of descriptors, reset) does not end serving
    }
    if (state->connections.size() >= state->config.max_connections ||
        state->handshakes >= state->config.max_handshakes) {
      state->refuse(socket);
      continue;
    }
    asio::co_spawn(state->executor, state->session(std::move(socket)), asio::detached);
  }
}

void Owner::stop() {
  auto& state = *state_;
  state.draining = true;
  state.reaper.cancel();
  for (const auto& connection : state.connections) connection->close();
  for (auto& [id, lease] : state.leases) {
    if (lease.exported) state.retired.push_back(std::move(lease.exported));
  }
  for (auto& [name, exported] : state.cached_exports) state.retired.push_back(std::move(exported));
  state.leases.clear();
  state.session_leases.clear();
  state.windowed_leases = 0;
  state.forget_cached_exports();
}

OwnerStats Owner::stats() const {
  OwnerStats stats = state_->stats;
  stats.live_leases = state_->leases.size();
  stats.open_connections = state_->connections.size();
  return stats;
}

}  // namespace corma
