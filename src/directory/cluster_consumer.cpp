// Fetching by name through the directory: the owners in the directory's
// order, a pooled connection each, the next owner when one is lost.
#include <corma/cluster_consumer.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <functional>
#include <list>
#include <map>
#include <optional>

namespace corma {

namespace asio = boost::asio;

namespace {

/// Whether another owner may serve what this one did not: every failure to
/// reach, greet or be served by an owner moves on (refused or closed,
/// silent past the io timeout, something that is not corma on its port or a
/// version it cannot agree on: `protocol`, a descriptor it cannot trust,
/// the owner draining, refusing for lack of room, or not holding the name).
/// An owner that fails the cluster key's proof (`not_owned` from
/// connected()) is left too; a `not_owned` answer to a fetch (a name no
/// owner may serve) ends the fetch.
/// What another owner would meet the same way ends the fetch: the caller's
/// cancellation, a range the object does not have, this side's sink or
/// provider failing (`backend`), and `object_changed` (bytes of a version
/// already written must not be followed by another version's).
bool another_owner_may_serve(const Error& error, bool connecting) {
  if (connecting && error.is(errc::not_owned)) return true;  // failed the proof
  return error.is(errc::peer_unreachable) || error.is(errc::timeout) || error.is(errc::shutting_down) ||
         error.is(errc::region_not_found) || error.is(errc::protocol) || error.is(errc::invalid_key) ||
         error.is(errc::budget_exceeded);
}

/// What a fetch every owner failed ends with: the one error they all gave
/// (all not holding the name: region_not_found), else object_changed when
/// owners were passed over for holding another version, else
/// peer_unreachable; saying each owner and why it was left.
Error every_owner_failed(const std::string& name, const std::vector<ClusterOutcome::Failed>& failed) {
  std::string tried;
  bool same = !failed.empty();
  bool other_versions = false;
  for (const auto& f : failed) {
    tried += (tried.empty() ? "" : "; ") + f.owner + ": " + f.error.message();
    same = same && f.error.code == failed.front().error.code;
    other_versions = other_versions || f.error.is(errc::object_changed);
  }
  const auto code = same             ? failed.front().error.code
                    : other_versions ? make_error_code(errc::object_changed)
                                     : make_error_code(errc::peer_unreachable);
  return Error{code, "every owner of '" + name + "' failed (" + tried + ")"};
}

/// Whether a fetch that failed this way may have written part of the
/// object into its destination: anything after the owner answered the
/// acquire may have.
bool may_have_written(const Error& error, bool connecting) {
  return !connecting && !error.is(errc::region_not_found) && !error.is(errc::budget_exceeded);
}

std::string version_text(std::optional<std::uint64_t> version) {
  return version ? "version " + std::to_string(*version) : "no version";
}

}  // namespace

struct ClusterConsumer::State {
  asio::any_io_executor executor;
  std::shared_ptr<Directory> directory;
  std::shared_ptr<Registry> registry;
  ConsumerConfig config;
  std::map<std::string, std::shared_ptr<Consumer>> pool;

  /// The pooled connection to `owner`, made now if there is none. A pooled
  /// connection that ended since (an owner closes idle ones, or died) is
  /// replaced, and every other ended one goes: the pool holds live
  /// connections only, however many owners came and went.
  asio::awaitable<Result<std::shared_ptr<Consumer>>> connected(const OwnerEntry& owner) {
    std::erase_if(pool, [](const auto& pooled) { return !pooled.second->is_connected(); });
    if (auto it = pool.find(owner.id); it != pool.end()) co_return it->second;
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(owner.host, ec);
    if (ec) co_return fail(errc::peer_unreachable, "owner " + owner.id + " announced '" + owner.host + "'");
    const asio::ip::tcp::endpoint endpoint(address, owner.port);
    auto for_owner = config;
    for_owner.expected_owner = owner.id;  // with a cluster key, it must prove to be this owner
    CORMA_CO_TRY(auto consumer, co_await Consumer::connect(executor, endpoint, registry, for_owner));
    std::shared_ptr<Consumer> shared = std::move(consumer);
    pool[owner.id] = shared;
    co_return shared;
  }

  using FetchFrom = std::function<asio::awaitable<Result<FetchOutcome>>(Consumer&)>;

  asio::awaitable<Result<ClusterOutcome>> fetch(const std::string& name, std::optional<std::uint64_t> wanted,
                                                 const FetchFrom& fetch_from) {
    CORMA_CO_TRY(auto owners, co_await directory->async_resolve(name));
    if (wanted) {
      std::erase_if(owners, [&](const OwnerEntry& owner) { return owner.version != wanted; });
      if (owners.empty()) {
        co_return fail(errc::object_changed, "no owner announces " + version_text(wanted) + " of '" + name + "'");
      }
    }
    ClusterOutcome outcome;
    // Set once an owner may have written part of the version it announced:
    // only owners announcing the same one may go on from there.
    std::optional<std::optional<std::uint64_t>> written;
    for (const auto& owner : owners) {
      if (written && owner.version != *written) {
        outcome.failed.push_back({owner.id, Error{make_error_code(errc::object_changed),
                                                  "holds " + version_text(owner.version) + ", and part of " +
                                                      version_text(*written) + " was written"}});
        continue;
      }
      auto consumer = co_await connected(owner);
      // Not a conditional expression around the co_await: g++ 12 destroys
      // the temporaries of one twice.
      Result<FetchOutcome> fetched = fail(errc::peer_unreachable, "not connected");
      const bool connecting = !consumer;
      if (consumer) {
        fetched = co_await fetch_from(*consumer.value());
      } else {
        fetched = std::move(consumer).error();
      }
      if (fetched) {
        outcome.fetch = std::move(fetched).value();
        outcome.owner = owner.id;
        outcome.version = owner.version;
        co_return outcome;
      }
      if (!another_owner_may_serve(fetched.error(), connecting)) co_return std::move(fetched).error();
      if (!written && may_have_written(fetched.error(), connecting)) written = owner.version;
      // Lost, stale in the directory, or not an owner at all: its
      // connection goes (unless it merely lacks the name), the next owner
      // is tried.
      if (!fetched.error().is(errc::region_not_found)) pool.erase(owner.id);
      ClusterOutcome::Failed failed{owner.id, std::move(fetched).error()};
      outcome.failed.push_back(std::move(failed));
    }
    co_return every_owner_failed(name, outcome.failed);
  }
};

ClusterConsumer::ClusterConsumer(asio::any_io_executor executor, std::shared_ptr<Directory> directory,
                                 std::shared_ptr<Registry> registry, ConsumerConfig config)
    : state_(std::make_shared<State>(State{std::move(executor), std::move(directory), std::move(registry),
                                           std::move(config), {}})) {}

ClusterConsumer::~ClusterConsumer() = default;

asio::any_io_executor ClusterConsumer::executor() const { return state_->executor; }

std::size_t ClusterConsumer::pooled() const { return state_->pool.size(); }

asio::awaitable<Result<ClusterOutcome>> ClusterConsumer::fetch_to(std::string name, StreamDestination destination,
                                                                  ClusterFetchOptions options) {
  auto state = state_;
  // Named, not a temporary in the co_await: g++ 12 destroys those twice.
  const State::FetchFrom from_owner = [&](Consumer& consumer) -> asio::awaitable<Result<FetchOutcome>> {
    auto attempt = destination;  // each owner starts from a copy of it
    co_return co_await consumer.async_fetch_to(name, std::move(attempt), options.range);
  };
  co_return co_await state->fetch(name, options.version, from_owner);
}

asio::awaitable<Result<ClusterOutcome>> ClusterConsumer::fetch_into(std::string name, RegionGuard& destination,
                                                                    ClusterFetchOptions options) {
  auto state = state_;
  const State::FetchFrom from_owner = [&](Consumer& consumer) -> asio::awaitable<Result<FetchOutcome>> {
    co_return co_await consumer.async_fetch_into(name, destination, options.range);
  };
  co_return co_await state->fetch(name, options.version, from_owner);
}

asio::awaitable<Result<ClusterManyFetched>> ClusterConsumer::fetch_many(std::vector<std::string> names,
                                                                       std::vector<FetchSlot> slots) {
  auto state = state_;
  if (names.size() != slots.size()) {
    co_return fail(errc::out_of_range, std::to_string(names.size()) + " names for " + std::to_string(slots.size()) +
                                           " destinations");
  }
  ClusterManyFetched result;
  result.outcomes.assign(names.size(), fail(errc::peer_unreachable, "not fetched"));
  result.owners.assign(names.size(), {});
  // Each name's owners, best first, and the next one to try.
  std::vector<std::vector<OwnerEntry>> candidates(names.size());
  std::vector<std::size_t> next(names.size(), 0);
  std::vector<std::size_t> pending;
  auto to_resolve = names;
  CORMA_CO_TRY(auto resolved, co_await state->directory->async_resolve_many(std::move(to_resolve)));
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!resolved[i]) {
      result.outcomes[i] = std::move(resolved[i]).error();
      continue;
    }
    candidates[i] = std::move(resolved[i]).value();
    pending.push_back(i);
  }
  // Rounds: every pending name to its next owner; the names of one owner
  // fetched together, the owners at once; the names whose owner failed go
  // round again with their next owner.
  while (!pending.empty()) {
    std::map<std::string, std::vector<std::size_t>> by_owner;
    std::map<std::string, const OwnerEntry*> owner_of;
    std::vector<std::size_t> exhausted;
    for (auto i : pending) {
      if (next[i] == candidates[i].size()) {
        exhausted.push_back(i);
        continue;
      }
      const auto& owner = candidates[i][next[i]++];
      by_owner[owner.id].push_back(i);
      owner_of[owner.id] = &owner;
    }
    pending.clear();
    std::size_t running = by_owner.size();
    asio::steady_timer all_done(state->executor, asio::steady_timer::time_point::max());
    // One signal per owner's fetch: the set's cancellation reaches each.
    std::list<asio::cancellation_signal> cancels;
    std::optional<Error> failed;  // an owner's fetch that threw
    for (auto& [id, indices] : by_owner) {
      asio::co_spawn(
          state->executor,
          [&, owner = owner_of[id], indices = indices]() -> asio::awaitable<void> {
            std::vector<std::string> subset_names;
            std::vector<FetchSlot> subset_slots;
            for (auto i : indices) {
              subset_names.push_back(names[i]);
              subset_slots.push_back(slots[i]);
            }
            auto consumer = co_await state->connected(*owner);
            const bool connecting = !consumer;
            Result<ManyFetched> fetched = fail(errc::peer_unreachable, "not connected");
            if (consumer) {
              fetched = co_await consumer.value()->async_fetch_many(std::move(subset_names), std::move(subset_slots));
            } else {
              fetched = std::move(consumer).error();
            }
            bool lost = false;
            for (std::size_t k = 0; k < indices.size(); ++k) {
              const auto i = indices[k];
              Result<FetchOutcome> outcome = fetched ? std::move(fetched.value()[k]) : Result<FetchOutcome>(fetched.error());
              if (outcome) {
                result.outcomes[i] = std::move(outcome);
                result.owners[i] = owner->id;
              } else if (another_owner_may_serve(outcome.error(), connecting)) {
                lost = lost || !outcome.error().is(errc::region_not_found);
                result.outcomes[i] = std::move(outcome).error();
                pending.push_back(i);  // to its next owner
              } else {
                result.outcomes[i] = std::move(outcome).error();
              }
            }
            if (lost) state->pool.erase(owner->id);
          },
          asio::bind_cancellation_slot(cancels.emplace_back().slot(), [&](std::exception_ptr thrown) {
            // Counted however the owner's fetch ended, a throw included.
            if (thrown && !failed) failed = Error{errc::backend, "an owner's fetch failed unexpectedly"};
            if (--running == 0) all_done.cancel();
          }));
    }
    // The owners' fetches use this frame's state until they end: the set's
    // cancellation is passed on to them, and the wait goes on, deaf, until
    // every one has answered (each within its connection's io timeout).
    bool cancelled = false;
    while (running > 0) {
      all_done.expires_at(asio::steady_timer::time_point::max());
      if (cancelled) {
        (void)co_await all_done.async_wait(
            asio::bind_cancellation_slot(asio::cancellation_slot(), asio::as_tuple(asio::use_awaitable)));
        continue;
      }
      (void)co_await all_done.async_wait(asio::as_tuple(asio::use_awaitable));
      auto cancellation = co_await asio::this_coro::cancellation_state;
      if (running > 0 && cancellation.cancelled() != asio::cancellation_type::none) {
        cancelled = true;
        for (auto& cancel : cancels) cancel.emit(asio::cancellation_type::terminal);
      }
    }
    if (failed) co_return std::move(*failed);
    auto cancellation = co_await asio::this_coro::cancellation_state;
    if (cancelled || cancellation.cancelled() != asio::cancellation_type::none) {
      // No next round: what is still pending keeps the error it has.
      for (auto i : pending) result.outcomes[i] = fail(errc::cancelled, "fetch cancelled");
      break;
    }
    (void)exhausted;  // their last owner's error stays their outcome
  }
  co_return result;
}

}  // namespace corma
