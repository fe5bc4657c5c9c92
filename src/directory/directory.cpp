// The Directory's two sides: an owner's announcement under a lease it keeps
// alive (re-announced when etcd lost the lease), and a consumer's
// resolutions from a cache refreshed from etcd, answered from older entries
// while etcd cannot be reached.
#include <corma/directory.hpp>
#include <corma/rendezvous.hpp>

#include "etcd_client.hpp"
#include "key_watch.hpp"
#include "records.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>

namespace corma {

namespace asio = boost::asio;
using directory::EtcdClient;
using clock_type = std::chrono::steady_clock;

namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

/// The rule: the newest version first (an owner that announced none after
/// every one that did: what it holds cannot be compared), then same
/// machine (shared memory), then least loaded, then a hash of the name and
/// owner id (stable, and spreading equal owners' names).
void order_owners(std::vector<OwnerEntry>& owners, const std::string& name, const std::string& machine) {
  const auto rank = [&](const OwnerEntry& owner) {
    const auto older = owner.version ? std::numeric_limits<std::uint64_t>::max() - *owner.version : 0;
    return std::make_tuple(owner.version ? 0 : 1, older, owner.machine == machine ? 0 : 1, owner.load,
                           std::hash<std::string>{}(name + '\0' + owner.id));
  };
  std::sort(owners.begin(), owners.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
}

/// The load source's figure, within what consumers accept.
std::uint64_t load_now(const Announcement& announcement) {
  return std::min(announcement.current_load(), directory::max_owner_load);
}

/// Owners whose bad entries were counted, each with the entry: a changed
/// entry is counted again. Bounded: past this many the set starts over.
constexpr std::size_t max_rejected_remembered = 10000;

}  // namespace

namespace {

/// One member's address; `tls` says whether it was written https://.
Result<EtcdMember> parse_member(std::string_view address, bool& tls) {
  tls = address.starts_with("https://");
  if (tls) address.remove_prefix(8);
  if (address.starts_with("http://")) address.remove_prefix(7);
  while (address.ends_with('/')) address.remove_suffix(1);
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return fail(errc::out_of_range, "a directory address is HOST:PORT, HOST an IP address");
  }
  EtcdMember member{std::string(address.substr(0, colon))};
  const auto port = address.substr(colon + 1);
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || value > 65535) return fail(errc::out_of_range, "a directory port is 1 to 65535");
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (port.empty() || value == 0 || value > 65535) return fail(errc::out_of_range, "a directory port is 1 to 65535");
  member.port = static_cast<std::uint16_t>(value);
  return member;
}

}  // namespace

Result<DirectoryConfig> parse_directory_address(std::string_view address) {
  DirectoryConfig config;
  bool first = true;
  for (;;) {
    const auto comma = address.find(',');
    bool tls = false;
    CORMA_TRY(auto member, parse_member(address.substr(0, comma), tls));
    if (first) {
      config.host = std::move(member.host);
      config.port = member.port;
      config.tls = tls;
      first = false;
    } else {
      if (tls != config.tls) {
        return fail(errc::out_of_range, "a directory's members are all https:// or none of them");
      }
      config.other_members.push_back(std::move(member));
    }
    if (comma == std::string_view::npos) return config;
    address.remove_prefix(comma + 1);
  }
}

struct Directory::State : std::enable_shared_from_this<State> {
  State(asio::any_io_executor ex, DirectoryConfig c)
      : executor(ex),
        config(std::move(c)),
        access(directory::access_of(config)),
        client(ex, access, config.request_timeout),
        renewal(ex) {
    if (config.machine.empty()) config.machine = host_name();
  }

  asio::any_io_executor executor;
  DirectoryConfig config;
  directory::EtcdAccess access;  ///< loaded once: the calls' and the watch's
  EtcdClient client;
  DirectoryStats stats;
  std::map<std::string, std::string> rejected;  ///< owner id: the bad entry counted

  // ---- the owner's side ----
  std::optional<Announcement> announcement;
  std::int64_t lease = 0;
  asio::steady_timer renewal;
  bool renewing = false;
  /// Moves on with every announce() and withdraw(): work begun for one
  /// announcement that finds another (or none) when etcd answers is dropped.
  std::uint64_t announcement_epoch = 0;

  /// Grants a lease and writes everything announced under it. A lease
  /// whose writes failed is revoked (entries missing under a lease renewed
  /// for ever would hide the owner's names): the next renewal grants and
  /// writes again.
  asio::awaitable<Result<void>> write_announcement() {
    if (!announcement) co_return fail(errc::shutting_down, "the owner was withdrawn");
    const auto epoch = announcement_epoch;
    if (announcement->current_load) announcement->owner.load = load_now(*announcement);
    const auto a = *announcement;  // a withdrawal while etcd answers must not pull it from under us
    CORMA_CO_TRY(auto granted, co_await client.grant_lease(a.ttl));
    if (epoch != announcement_epoch) {
      // Withdrawn, or announced anew, while etcd granted it: nobody's lease.
      (void)co_await client.revoke(granted);
      co_return fail(errc::shutting_down, "the announcement changed while its lease was granted");
    }
    lease = granted;
    ++stats.leases_granted;
    if (auto written = co_await client.put_all(keys_of(a), granted); !written) {
      if (lease == granted) {
        lease = 0;
        (void)co_await client.revoke(granted);  // if etcd is gone too, the lease lapses unrenewed
      }
      co_return written;
    }
    stats.announced = true;
    co_return success();
  }

  /// Every key an announcement writes, with its value.
  [[nodiscard]] std::vector<directory::KeyValue> keys_of(const Announcement& a) const {
    std::vector<directory::KeyValue> kvs;
    kvs.push_back({directory::owner_key(config, a.owner.id), directory::encode_owner(a.owner), 0});
    for (const auto& name : a.names) {
      const auto version = a.versions.find(name);
      kvs.push_back({directory::name_key(config, name, a.owner.id),
                     directory::encode_name_value(version == a.versions.end()
                                                      ? std::nullopt
                                                      : std::optional<std::uint64_t>(version->second)),
                     0});
    }
    for (const auto& prefix : a.prefixes) kvs.push_back({directory::prefix_key(config, prefix, a.owner.id), {}, 0});
    return kvs;
  }

  /// The same owner announced anew while it holds a lease: the keys that
  /// changed are written under that lease and those no longer announced
  /// deleted, so no consumer finds the owner missing meanwhile. When that
  /// fails, the lease is revoked: the next renewal grants one and writes
  /// everything.
  asio::awaitable<Result<void>> rewrite_announcement(const Announcement& previous) {
    const auto epoch = announcement_epoch;
    const auto held = lease;
    if (announcement->current_load) announcement->owner.load = load_now(*announcement);
    std::map<std::string, std::string> before;
    for (auto& kv : keys_of(previous)) before.emplace(std::move(kv.key), std::move(kv.value));
    std::vector<directory::KeyValue> changed;
    for (auto& kv : keys_of(*announcement)) {
      auto it = before.find(kv.key);
      if (it == before.end() || it->second != kv.value) changed.push_back(std::move(kv));
      if (it != before.end()) before.erase(it);
    }
    std::vector<std::string> gone;
    for (auto& [key, value] : before) gone.push_back(key);
    auto written = co_await client.put_all(changed, held);
    if (written) written = co_await client.delete_all(gone);
    if (!written && epoch == announcement_epoch && lease == held) {
      lease = 0;
      (void)co_await client.revoke(held);
    }
    co_return written;
  }

  /// Rewrites the owner's entry when its load source gives a new figure.
  asio::awaitable<Result<void>> write_changed_load() {
    if (!announcement || !announcement->current_load) co_return success();
    auto entry = announcement->owner;
    const auto announced_load = entry.load;
    entry.load = load_now(*announcement);
    if (entry.load == announced_load) co_return success();
    CORMA_CO_TRY(co_await client.put(directory::owner_key(config, entry.id), directory::encode_owner(entry), lease));
    // Unless a new announcement replaced this one meanwhile.
    if (announcement && announcement->owner.id == entry.id && announcement->owner.load == announced_load) {
      announcement->owner.load = entry.load;
    }
    co_return success();
  }

  /// Renews the lease every third of its ttl until withdrawn or destroyed;
  /// a lease etcd no longer has is granted again and everything rewritten.
  static asio::awaitable<void> keep_renewing(std::weak_ptr<State> weak) {
    for (;;) {
      auto self = weak.lock();
      if (!self || !self->announcement) co_return;
      // A third of the ttl in milliseconds: in whole seconds, a ttl of 1 or
      // 2 s would round it to nothing.
      self->renewal.expires_after(std::max<std::chrono::milliseconds>(
          std::chrono::milliseconds(self->announcement->ttl) / 3, std::chrono::milliseconds(100)));
      auto& timer = self->renewal;
      self.reset();  // the wait must not keep the state alive
      auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
      self = weak.lock();
      if (!self || ec || !self->announcement) co_return;
      const auto epoch = self->announcement_epoch;
      Result<void> renewed = fail(errc::region_not_found, "no lease: its writes failed");
      if (self->lease != 0) renewed = co_await self->client.keep_alive(self->lease);
      // Withdrawn or announced anew meanwhile: that call looks after its own.
      if (!self->announcement || epoch != self->announcement_epoch) continue;
      if (!renewed && renewed.error().is(errc::region_not_found)) renewed = co_await self->write_announcement();
      if (renewed) renewed = co_await self->write_changed_load();
      if (!renewed) ++self->stats.etcd_failures;  // tried again at the next turn
    }
  }

  // ---- the consumer's side ----
  /// One family of keys (owners, names of one name, prefixes) as last read.
  /// What one family of keys held when read; the owners' entries decoded
  /// once, when that family is read.
  struct Family {
    std::vector<directory::KeyValue> kvs;
    std::map<std::string, OwnerEntry, std::less<>> owners;
    std::int64_t revision = 0;  ///< etcd's revision the family holds up to (read, or changed since)
  };
  struct Cached {
    std::shared_ptr<const Family> family;
    clock_type::time_point read;
    std::uint64_t epoch = 0;  ///< the watch's epoch it was read in (0: no live watch)
  };
  /// Watches the whole key prefix once anything was resolved: a change
  /// drops what it touches from the cache, so an entry read while the
  /// watch is live stays good until a change comes (a deleted owner leaves
  /// at once). Read while it is not live, an entry is good for cache_ttl.
  std::shared_ptr<directory::KeyWatch> watch;
  bool watch_live = false;
  std::uint64_t watch_epoch = 0;
  std::uint64_t changes_seen = 0;  ///< changes the watch reported, ever

  void start_watch() {
    if (watch || !config.watch) return;
    directory::KeyWatch::Callbacks callbacks;
    callbacks.changed = [weak = weak_from_this()](const directory::KeyWatch::Change& change) {
      if (auto self = weak.lock()) self->apply(change);
    };
    callbacks.live = [weak = weak_from_this()](bool live) {
      auto self = weak.lock();
      if (!self) return;
      self->watch_live = live;
      if (live) ++self->watch_epoch;  // what was read before may have missed changes
    };
    watch = std::make_shared<directory::KeyWatch>(executor, access, config.key_prefix + "/",
                                                  std::chrono::milliseconds(500), std::move(callbacks));
    watch->start();
  }

  /// The cache's family a key belongs to, if it is one of the cluster's.
  [[nodiscard]] std::optional<std::string> family_of(const std::string& key) const {
    if (key.starts_with(directory::owners_prefix(config))) return directory::owners_prefix(config);
    if (auto name = directory::split_name_key(key, directory::names_prefix(config))) {
      return directory::name_key(config, name->name, "");
    }
    if (key.starts_with(directory::prefixes_prefix(config))) return directory::prefixes_prefix(config);
    return std::nullopt;
  }

  /// A key changed: its cached family takes the change (one owner's new
  /// load rewrites that owner's entry, not the whole family), unless the
  /// family was read after it. A family not read under this live watch
  /// cannot be vouched for by it (a change before the watch began may be
  /// missing): it goes, and is read again under the watch.
  void apply(const directory::KeyWatch::Change& change) {
    ++changes_seen;
    const auto family_key = family_of(change.key);
    if (!family_key) return;
    auto it = cache.find(*family_key);
    if (it == cache.end()) return;
    if (it->second.epoch == 0 || it->second.epoch != watch_epoch) {
      cache.erase(it);
      return;
    }
    if (change.revision <= it->second.family->revision) return;
    auto family = std::make_shared<Family>(*it->second.family);
    family->revision = change.revision;
    std::erase_if(family->kvs, [&](const directory::KeyValue& kv) { return kv.key == change.key; });
    if (change.value) family->kvs.push_back({change.key, *change.value, 0});
    if (*family_key == directory::owners_prefix(config)) {
      const auto id = change.key.substr(family_key->size());
      family->owners.erase(id);
      if (change.value) add_owner(*family, id, *change.value);
    }
    it->second.family = std::move(family);
  }

  /// An owner entry into `family`, if it is one a consumer can use.
  void add_owner(Family& family, const std::string& id, const std::string& value) {
    // An entry that is not one is skipped: another writer's mistake must
    // not hide the owners that announced themselves properly.
    auto owner = directory::decode_owner(id, value);
    if (!owner) {
      reject(id, value, owner.error());
      return;
    }
    family.owners.emplace(id, std::move(owner).value());
  }

  [[nodiscard]] bool fresh(const Cached& entry, clock_type::time_point now) const {
    // Read under a watch: good exactly while that watch lives. Read without
    // one: good for cache_ttl.
    if (entry.epoch != 0) return watch_live && entry.epoch == watch_epoch;
    return now - entry.read < config.cache_ttl;
  }
  std::map<std::string, Cached, std::less<>> cache;
  static constexpr std::size_t max_cached_families = 65536;

  using FamilyRead = Result<std::shared_ptr<const Family>>;

  /// The keys under each of `prefixes`: from the cache while fresh, the
  /// rest from etcd in one pass (transactions of up to 128 ranges); from
  /// the old cache entry when etcd cannot be reached (`stale` set), or the
  /// error where there is none.
  asio::awaitable<std::vector<FamilyRead>> keys_under(const std::vector<std::string>& prefixes, bool& stale) {
    start_watch();
    std::vector<FamilyRead> families(prefixes.size(), fail(errc::region_not_found, "not read"));
    std::vector<std::string> missing;
    std::vector<std::size_t> missing_at;
    const auto now = clock_type::now();
    for (std::size_t i = 0; i < prefixes.size(); ++i) {
      if (auto it = cache.find(prefixes[i]); it != cache.end() && fresh(it->second, now)) {
        ++stats.cache_hits;
        families[i] = it->second.family;
      } else {
        missing.push_back(prefixes[i]);
        missing_at.push_back(i);
      }
    }
    if (missing.empty()) co_return families;
    const auto epoch = watch_live ? watch_epoch : 0;
    const auto changes_before = changes_seen;
    auto read = co_await client.range_prefixes(missing);
    if (!read) {
      ++stats.etcd_failures;
      for (auto i : missing_at) {
        // Looked up after the read: it may have outlived an entry the watch dropped.
        if (auto it = cache.find(prefixes[i]); it != cache.end()) {
          stale = true;
          families[i] = it->second.family;
        } else {
          families[i] = read.error();
        }
      }
      co_return families;
    }
    // Good while the watch that was live before the read stays live, unless
    // a change came during the read (the read may predate it).
    const auto good_in = watch_live && watch_epoch == epoch && changes_seen == changes_before ? epoch : 0;
    for (std::size_t k = 0; k < missing.size(); ++k) {
      families[missing_at[k]] = store(missing[k], std::move(read.value()[k]), now, good_in);
    }
    co_return families;
  }

  /// Counts a bad owner entry and tells the config's reporter, once per
  /// owner and entry.
  void reject(std::string id, const std::string& value, const Error& why) {
    auto [it, fresh] = rejected.try_emplace(std::move(id), value);
    if (!fresh && it->second == value) return;
    it->second = value;
    ++stats.rejected_entries;
    if (config.on_rejected_entry) config.on_rejected_entry(it->first, why);
    if (rejected.size() > max_rejected_remembered) rejected.clear();
  }

  std::shared_ptr<const Family> store(const std::string& prefix, directory::RangeResult range,
                                      clock_type::time_point read, std::uint64_t epoch) {
    auto family = std::make_shared<Family>();
    family->kvs = std::move(range.kvs);
    family->revision = range.revision;
    if (prefix == directory::owners_prefix(config)) {
      for (const auto& kv : family->kvs) add_owner(*family, kv.key.substr(prefix.size()), kv.value);
    }
    // Bounded: past this many names the cache starts over.
    if (cache.size() >= max_cached_families) cache.clear();
    auto& entry = cache[prefix];
    entry.family = std::move(family);
    entry.read = read;
    entry.epoch = epoch;
    return entry.family;
  }
};

Directory::Directory(asio::any_io_executor executor, DirectoryConfig config)
    : state_(std::make_shared<State>(std::move(executor), std::move(config))) {}

Directory::~Directory() {
  state_->announcement.reset();
  state_->renewal.cancel();
  if (state_->watch) state_->watch->stop();
}

asio::any_io_executor Directory::executor() const { return state_->executor; }

DirectoryStats Directory::stats() const {
  auto stats = state_->stats;
  stats.watching = state_->watch_live;
  stats.etcd_requests = state_->client.calls();
  return stats;
}

asio::awaitable<Result<void>> Directory::announce(Announcement announcement) {
  auto state = state_;
  CORMA_CO_TRY(directory::check_owner_id(announcement.owner.id));
  CORMA_CO_TRY(directory::check_owner_entry(announcement.owner));
  if (announcement.ttl.count() < 1) co_return fail(errc::out_of_range, "an announcement's ttl is at least 1 s");
  // Names and prefixes end keys before the owner id: a NUL in one, or a
  // name no owner could serve, is refused here.
  for (const auto& name : announcement.names) {
    CORMA_CO_TRY(check_object_name(name));
  }
  for (const auto& versioned : announcement.versions) {
    if (std::find(announcement.names.begin(), announcement.names.end(), versioned.first) == announcement.names.end()) {
      co_return fail(errc::out_of_range, "a version for '" + versioned.first + "', a name not announced");
    }
  }
  for (const auto& prefix : announcement.prefixes) {
    if (prefix.empty()) continue;  // every name
    CORMA_CO_TRY(check_object_name(prefix));
  }
  ++state->announcement_epoch;
  if (state->lease != 0 && state->announcement && state->announcement->owner.id == announcement.owner.id &&
      state->announcement->ttl == announcement.ttl) {
    const auto previous = std::exchange(*state->announcement, std::move(announcement));
    co_return co_await state->rewrite_announcement(previous);
  }
  if (state->lease != 0) (void)co_await state->client.revoke(std::exchange(state->lease, 0));
  state->announcement = std::move(announcement);
  auto written = co_await state->write_announcement();
  if (!written) {
    state->announcement.reset();
    co_return written;
  }
  if (!state->renewing) {
    state->renewing = true;
    asio::co_spawn(state->executor,
                   [weak = std::weak_ptr(state)]() -> asio::awaitable<void> {
                     co_await State::keep_renewing(weak);
                     if (auto s = weak.lock()) s->renewing = false;
                   },
                   asio::detached);
  }
  co_return success();
}

asio::awaitable<Result<void>> Directory::withdraw() {
  auto state = state_;
  ++state->announcement_epoch;
  state->announcement.reset();
  state->stats.announced = false;
  state->renewal.cancel();
  if (state->lease == 0) co_return success();
  co_return co_await state->client.revoke(std::exchange(state->lease, 0));
}

asio::awaitable<Result<std::vector<OwnerEntry>>> Directory::resolve(std::string name) {
  std::vector<std::string> one{std::move(name)};
  CORMA_CO_TRY(auto resolved, co_await resolve_many(std::move(one)));
  co_return std::move(resolved.front());
}

asio::awaitable<Result<std::vector<Resolution>>> Directory::resolve_many(std::vector<std::string> names) {
  auto state = state_;
  const auto& config = state->config;
  state->stats.resolutions += names.size();
  // Every family the set needs, read in one pass: each name's own keys,
  // the prefixes and the owners (the last two).
  std::vector<std::string> families;
  families.reserve(names.size() + 2);
  for (const auto& name : names) families.push_back(directory::name_key(config, name, ""));
  families.push_back(directory::prefixes_prefix(config));
  families.push_back(directory::owners_prefix(config));
  bool stale = false;
  auto read = co_await state->keys_under(families, stale);
  CORMA_CO_TRY(auto known, std::move(read.back()));
  CORMA_CO_TRY(auto prefixed, std::move(read[names.size()]));

  std::vector<Resolution> resolved;
  resolved.reserve(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& name = names[i];
    if (!read[i]) {
      resolved.emplace_back(std::move(read[i]).error());
      continue;
    }
    // Each owner serving the name, with the version it announced for it
    // (by a prefix: none).
    std::map<std::string, std::optional<std::uint64_t>> ids;
    for (const auto& kv : read[i].value()->kvs) {
      auto split = directory::split_name_key(kv.key, directory::names_prefix(config));
      if (!split || split->name != name) continue;
      auto version = directory::decode_name_value(kv.value);
      if (!version) {
        state->reject(split->owner, kv.value, version.error());  // skipped for this name
        continue;
      }
      ids[split->owner] = version.value();
    }
    for (const auto& kv : prefixed->kvs) {
      auto split = directory::split_name_key(kv.key, directory::prefixes_prefix(config));
      if (split && name.starts_with(split->name)) ids.try_emplace(split->owner);
    }
    std::vector<OwnerEntry> owners;
    for (const auto& [id, version] : ids) {
      if (auto it = known->owners.find(id); it != known->owners.end()) {
        owners.push_back(it->second);
        owners.back().version = version;
      }
    }
    if (ids.empty()) {
      resolved.emplace_back(fail(errc::region_not_found, "no owner announces '" + name + "'"));
    } else if (owners.empty()) {
      resolved.emplace_back(fail(errc::region_not_found, "the owners announcing '" + name + "' are gone"));
    } else {
      order_owners(owners, name, config.machine);
      resolved.emplace_back(std::move(owners));
      if (stale) ++state->stats.stale_resolutions;  // answered, from what the cache held
    }
  }
  co_return resolved;
}

asio::awaitable<Result<std::vector<DirectoryListing>>> Directory::list(std::string prefix) {
  auto state = state_;
  const auto& config = state->config;
  std::vector<DirectoryListing> listing;
  // Names, prefixes and owners in one transaction: one revision of etcd, so
  // an owner withdrawing meanwhile is listed whole or not at all, never as
  // names without their owner entry.
  const std::vector<std::string> families = {directory::names_prefix(config) + prefix,
                                             directory::prefixes_prefix(config), directory::owners_prefix(config)};
  CORMA_CO_TRY(auto read, co_await state->client.range_prefixes(families));  // one range per family, or an error
  const auto& named = read[0];
  const auto& prefixed = read[1];
  const auto& owners = read[2];
  std::map<std::size_t, std::string> bad_values;  // listing index: why its name's entry is unusable
  for (const auto& kv : named.kvs) {
    if (auto split = directory::split_name_key(kv.key, directory::names_prefix(config))) {
      auto version = directory::decode_name_value(kv.value);
      if (!version) bad_values.emplace(listing.size(), version.error().message());
      listing.push_back({std::move(split->name), std::move(split->owner), version ? version.value() : std::nullopt});
    }
  }
  for (const auto& kv : prefixed.kvs) {
    auto split = directory::split_name_key(kv.key, directory::prefixes_prefix(config));
    if (split && (split->name.starts_with(prefix) || prefix.starts_with(split->name))) {
      listing.push_back({split->name + "*", std::move(split->owner)});
    }
  }
  // Each owner's entry, checked as a consumer checks it before ranking.
  std::map<std::string, std::string, std::less<>> why_unusable;  // owner id: "" when its entry is good
  for (const auto& kv : owners.kvs) {
    const auto id = std::string_view(kv.key).substr(directory::owners_prefix(config).size());
    auto entry = directory::decode_owner(id, kv.value);
    why_unusable.emplace(id, entry ? std::string() : entry.error().message());
  }
  for (std::size_t i = 0; i < listing.size(); ++i) {
    auto& listed = listing[i];
    auto it = why_unusable.find(listed.owner);
    listed.unusable = it == why_unusable.end() ? "it has no owner entry" : it->second;
    if (auto bad = bad_values.find(i); listed.unusable.empty() && bad != bad_values.end()) listed.unusable = bad->second;
  }
  co_return listing;
}

}  // namespace corma
