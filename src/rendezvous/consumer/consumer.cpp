#include <corma/consumer.hpp>

#include "rendezvous/consumer/consumer_state.hpp"
#include "rendezvous/consumer/keep_until_deregistered.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;
using namespace asio::experimental::awaitable_operators;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

}  // namespace

asio::awaitable<Result<std::unique_ptr<Consumer>>> Consumer::connect_and_greet(asio::any_io_executor executor,
                                                                               asio::ip::tcp::endpoint owner,
                                                                               std::shared_ptr<Registry> registry,
                                                                               ConsumerConfig config) {
  auto state = std::make_shared<State>(executor, std::move(registry), config);
  asio::ip::tcp::socket socket(executor);
  asio::steady_timer timer(executor, config.io_timeout);
  auto connected = co_await (socket.async_connect(owner, as_result) || timer.async_wait(as_result));
  if (connected.index() == 1) co_return fail(errc::timeout, "connecting to the owner timed out");
  if (auto [ec] = std::get<0>(connected); ec) {
    co_return fail(errc::peer_unreachable, "cannot connect to the owner: " + ec.message());
  }
  state->dialled = owner;
  state->open(std::move(socket));
  CORMA_CO_TRY(co_await state->hello());
  co_return std::unique_ptr<Consumer>(new Consumer(std::move(state)));
}

Consumer::Consumer(std::shared_ptr<State> state) : state_(std::move(state)) {}

Consumer::~Consumer() {
  state_->leases->stop();
  state_->link->close();
  if (state_->peer && state_->registry) {
    state_->registry->backend()->async_peer_close(*state_->peer, [](Result<void>) {});
  }
  if (state_->push_peer && state_->registry) {
    state_->registry->backend()->async_peer_close(*state_->push_peer, [](Result<void>) {});
  }
}

namespace {

/// Fresh memory for one fetch, allocated into `holder` when the fetch needs
/// it; a transfer that outlives the fetch takes it over until its
/// registration is gone.
Consumer::State::Destination fresh_buffer_in(OwnedBuffer& holder, rendezvous::Sink sink = {}) {
  return {[&holder](std::uint64_t size) -> Result<std::span<std::byte>> {
            // Exactly the bytes fetched: Fetched::data of nothing is empty.
            holder = size == 0 ? OwnedBuffer{} : OwnedBuffer::allocate(size);
            return holder.bytes();
          },
          nullptr,
          0,
          [&holder](DeregisteredEvent released) { keep_until_deregistered(std::move(holder), released); },
          std::move(sink)};
}

asio::awaitable<Result<Fetched>> fetch_new(std::shared_ptr<Consumer::State> state, std::string name,
                                           ByteRange range) {
  CORMA_CO_TRY(const auto place, co_await state->fetches.enter());
  Fetched fetched;
  CORMA_CO_TRY(auto outcome, co_await state->fetch(std::move(name), fresh_buffer_in(fetched.data), range));
  static_cast<FetchOutcome&>(fetched) = std::move(outcome);
  co_return fetched;
}

/// The caller's landing memory for an RDMA read, whose keepalive goes into
/// `held` once it is asked for; a transfer that outlives the fetch takes
/// the keepalive over until its registration is gone.
Consumer::State::Destination landing_in(std::shared_ptr<const void>& held, StreamDestination destination,
                                        const asio::any_io_executor& home) {
  Consumer::State::Destination landing;
  landing.span_for = [&held, landing_for = std::move(destination.rdma_landing)](
                         std::uint64_t size) -> Result<std::span<std::byte>> {
    CORMA_TRY(auto landed, landing_for(size));
    if (landed.memory.size() < size) {
      return fail(errc::out_of_range, "the landing memory holds " + std::to_string(landed.memory.size()) +
                                          " bytes, the fetch needs " + std::to_string(size));
    }
    held = std::move(landed.keepalive);
    return landed.memory.first(size);
  };
  landing.keep_until = [&held](DeregisteredEvent released) {
    keep_until_deregistered(std::exchange(held, nullptr), released);
  };
  landing.sink = rendezvous::Sink::of(destination, home);
  landing.rdma_lands_for_good = true;
  landing.chunks_to_memory = destination.chunks_to_landing;
  return landing;
}

asio::awaitable<Result<FetchOutcome>> fetch_to(std::shared_ptr<Consumer::State> state, std::string name,
                                               StreamDestination destination, ByteRange range) {
  CORMA_CO_TRY(const auto place, co_await state->fetches.enter());
  // Used only when the owner grants RDMA: the caller's landing memory, or
  // fresh memory handed to the sink.
  std::shared_ptr<const void> landing_keepalive;
  OwnedBuffer rdma_landing;
  const auto fetch_destination =
      destination.rdma_landing ? landing_in(landing_keepalive, std::move(destination), state->executor)
                               : fresh_buffer_in(rdma_landing, rendezvous::Sink::of(destination, state->executor));
  co_return co_await state->fetch(std::move(name), fetch_destination, range);
}

asio::awaitable<Result<FetchOutcome>> fetch_into(std::shared_ptr<Consumer::State> state, std::string name,
                                                 RegionGuard& destination, ByteRange range) {
  CORMA_CO_TRY(const auto place, co_await state->fetches.enter());
  const auto registered = registered_destination(destination, 0, destination.size());
  co_return co_await state->fetch(std::move(name), registered, range);
}

asio::awaitable<Result<FetchOutcome>> push_fetch(std::shared_ptr<Consumer::State> state, std::string name,
                                                 RegionGuard& landing, PushOptions options) {
  CORMA_CO_TRY(const auto place, co_await state->fetches.enter());
  co_return co_await state->push_fetch(std::move(name), landing, options);
}

asio::awaitable<Result<ManyFetched>> fetch_many(std::shared_ptr<Consumer::State> state,
                                                std::vector<std::string> names, std::vector<FetchSlot> slots) {
  if (names.size() != slots.size()) {
    co_return fail(errc::out_of_range, std::to_string(names.size()) + " names for " + std::to_string(slots.size()) +
                                           " destinations");
  }
  CORMA_CO_TRY(const auto place, co_await state->fetches.enter());
  co_return co_await state->fetch_many(std::move(names), std::move(slots));
}

}  // namespace

// A fetch runs on a coroutine thread of its own (detail::as_operation): a
// cancelled fetch is answered `cancelled` once it reached a safe point,
// never by an exception thrown out of the middle of a request.
asio::awaitable<Result<Fetched>> Consumer::fetch_coroutine(std::string name, ByteRange range) {
  return fetch_new(state_, std::move(name), range);
}

asio::awaitable<Result<FetchOutcome>> Consumer::fetch_into_coroutine(std::string name, RegionGuard& destination,
                                                                     ByteRange range) {
  return fetch_into(state_, std::move(name), destination, range);
}

asio::awaitable<Result<FetchOutcome>> Consumer::fetch_to_coroutine(std::string name, StreamDestination destination,
                                                                   ByteRange range) {
  return fetch_to(state_, std::move(name), std::move(destination), range);
}

asio::awaitable<Result<FetchOutcome>> Consumer::push_fetch_coroutine(std::string name, RegionGuard& landing,
                                                                     PushOptions options) {
  return push_fetch(state_, std::move(name), landing, options);
}

asio::awaitable<Result<ManyFetched>> Consumer::fetch_many_coroutine(std::vector<std::string> names,
                                                                   std::vector<FetchSlot> slots) {
  return fetch_many(state_, std::move(names), std::move(slots));
}

std::string FetchOutcome::reason_text() const {
  if (!reason) return {};
  std::string text(to_string(*reason));
  return failure.empty() ? text : text + ": " + failure;
}

asio::any_io_executor Consumer::executor() const { return state_->executor; }

std::uint16_t Consumer::protocol_version() const noexcept { return state_->version; }
const std::string& Consumer::proven_owner() const noexcept { return state_->proven_owner; }
bool Consumer::rdma_ready() const noexcept { return state_->peer.has_value(); }
bool Consumer::is_connected() const noexcept { return state_->link && state_->link->is_open(); }
ConsumerStats Consumer::stats() const {
  auto stats = state_->stats;
  stats.renewals = state_->leases->renewals();
  stats.heartbeats = state_->leases->heartbeats();
  return stats;
}

}  // namespace corma
