#include "rendezvous/owner/owner_state.hpp"

#include <cerrno>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

namespace {

/// How long an owner out of descriptors waits before it accepts again.
constexpr std::chrono::milliseconds accept_retry_pause{50};

}  // namespace

Owner::Owner(asio::any_io_executor executor, std::shared_ptr<Registry> registry, OwnerConfig config)
    : state_(std::make_shared<State>(executor, std::move(registry), config)) {
  asio::co_spawn(executor, state_->reap(), asio::detached);
  asio::co_spawn(executor, state_->dispatch(), asio::detached);
}

Owner::~Owner() { stop(); }

void Owner::publish(std::string name, PublishedObject object) {
  // New bytes under an old name: the old export must not be handed out again.
  state_->forget_export(name);
  state_->publications.publish(std::move(name), std::move(object));
}

bool Owner::unpublish(std::string_view name) {
  if (!state_->publications.contains(name)) return false;
  state_->forget_export(std::string(name));
  return state_->publications.unpublish(name);
}

void Owner::set_resolver(ObjectResolver resolver, ResolverRefresh refresh) {
  state_->resolver = std::move(resolver);
  state_->async_resolver = nullptr;
  state_->refresh_resolver = std::move(refresh);
}

void Owner::set_resolver(AsyncObjectResolver resolver, ResolverRefresh refresh) {
  state_->resolver = nullptr;
  state_->async_resolver = std::move(resolver);
  state_->refresh_resolver = std::move(refresh);
}

asio::any_io_executor Owner::executor() const { return state_->executor; }

asio::awaitable<void> Owner::accept_loop(asio::ip::tcp::acceptor& acceptor) {
  auto state = state_;
  // Listed while it waits for connections, however the loop ends.
  const rendezvous::ConnectionTable::Listening listed(state->connections, acceptor);
  auto admit = [&state](asio::ip::tcp::socket socket) {
    if (state->connections.full()) {
      state->refuse(socket);
      return;
    }
    asio::co_spawn(state->executor, state->session(std::move(socket)), asio::detached);
  };
  // Connections waiting to be accepted are taken many at a time: one per
  // turn of the event loop would leave a newcomer behind every connection
  // of a flood that arrived before it, each waiting for a whole turn.
  boost::system::error_code ignored;
  acceptor.non_blocking(true, ignored);
  constexpr int accepts_per_turn = 256;
  while (!state->draining) {
    auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
      // A failed accept does not end serving. Out of descriptors or memory,
      // the connection stays in the backlog and the next accept fails at
      // once: wait a moment instead of spinning on it.
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory ||
          ec.value() == ENFILE) {
        asio::steady_timer pause(state->executor, accept_retry_pause);
        (void)co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      }
      continue;
    }
    admit(std::move(socket));
    for (int more = 1; more < accepts_per_turn && !state->draining; ++more) {
      boost::system::error_code none_left;
      auto waiting = acceptor.accept(state->executor, none_left);
      if (none_left) break;  // would block: the backlog is empty (or an accept failed: the loop retries)
      admit(std::move(waiting));
    }
  }
}

void Owner::stop() {
  auto& state = *state_;
  state.draining = true;
  state.reaper.cancel();
  state.connections.stop_all();  // the accept loops end; the acceptors stay open
  state.work.wake();
  state.leases.clear([&state](rendezvous::Lease& lease) {
    if (lease.exported) state.retired.push_back(std::move(lease.exported));
  });
  // Nothing is lent again: the cached exports go (the ones leases read, with them).
  state.publications.for_each_name([&state](const std::string& name) { state.forget_export(name); });
}

OwnerStats Owner::stats() const {
  OwnerStats stats = state_->stats;
  stats.exports_evicted = state_->exports.evicted();
  stats.live_leases = state_->leases.size();
  stats.open_connections = state_->connections.size();
  return stats;
}

}  // namespace corma
