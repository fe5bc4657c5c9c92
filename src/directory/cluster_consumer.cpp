// Fetching by name through the directory: the owners in the directory's
// order, a pooled connection each, the next owner when one is lost.
#include <corma/cluster_consumer.hpp>

#include <boost/asio/ip/tcp.hpp>

#include <functional>
#include <map>

namespace corma {

namespace asio = boost::asio;

namespace {

/// The owner, not the object, failed: another owner may serve it.
bool owner_failed(const Error& error) {
  return error.is(errc::peer_unreachable) || error.is(errc::timeout) || error.is(errc::shutting_down) ||
         error.is(errc::region_not_found);
}

}  // namespace

struct ClusterConsumer::State {
  asio::any_io_executor executor;
  std::shared_ptr<Directory> directory;
  std::shared_ptr<Registry> registry;
  ConsumerConfig config;
  std::map<std::string, std::shared_ptr<Consumer>> pool;

  /// The pooled connection to `owner`, made now if there is none.
  asio::awaitable<Result<std::shared_ptr<Consumer>>> connected(const OwnerEntry& owner) {
    if (auto it = pool.find(owner.id); it != pool.end()) co_return it->second;
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(owner.host, ec);
    if (ec) co_return fail(errc::peer_unreachable, "owner " + owner.id + " announced '" + owner.host + "'");
    const asio::ip::tcp::endpoint endpoint(address, owner.port);
    CORMA_CO_TRY(auto consumer, co_await Consumer::connect(executor, endpoint, registry, config));
    std::shared_ptr<Consumer> shared = std::move(consumer);
    pool[owner.id] = shared;
    co_return shared;
  }

  using FetchFrom = std::function<asio::awaitable<Result<FetchOutcome>>(Consumer&)>;

  asio::awaitable<Result<ClusterOutcome>> fetch(const std::string& name, const FetchFrom& fetch_from) {
    CORMA_CO_TRY(auto owners, co_await directory->async_resolve(name));
    ClusterOutcome outcome;
    bool only_not_found = true;
    for (const auto& owner : owners) {
      auto consumer = co_await connected(owner);
      // Not a conditional expression around the co_await: g++ 12 destroys
      // the temporaries of one twice.
      Result<FetchOutcome> fetched = fail(errc::peer_unreachable, "not connected");
      if (consumer) {
        fetched = co_await fetch_from(*consumer.value());
      } else {
        fetched = std::move(consumer).error();
      }
      if (fetched) {
        outcome.fetch = std::move(fetched).value();
        outcome.owner = owner.id;
        co_return outcome;
      }
      if (!owner_failed(fetched.error())) co_return std::move(fetched).error();
      // Lost (or stale in the directory): its connection goes, the next owner is tried.
      if (!fetched.error().is(errc::region_not_found)) {
        only_not_found = false;
        pool.erase(owner.id);
      }
      ClusterOutcome::Failed failed{owner.id, std::move(fetched).error()};
      outcome.failed.push_back(std::move(failed));
    }
    std::string tried;
    for (const auto& failed : outcome.failed) tried += (tried.empty() ? "" : "; ") + failed.owner + ": " + failed.error.message();
    co_return fail(only_not_found ? errc::region_not_found : errc::peer_unreachable,
                   "every owner of '" + name + "' failed (" + tried + ")");
  }
};

ClusterConsumer::ClusterConsumer(asio::any_io_executor executor, std::shared_ptr<Directory> directory,
                                 std::shared_ptr<Registry> registry, ConsumerConfig config)
    : state_(std::make_shared<State>(State{std::move(executor), std::move(directory), std::move(registry),
                                           std::move(config), {}})) {}

ClusterConsumer::~ClusterConsumer() = default;

asio::any_io_executor ClusterConsumer::executor() const { return state_->executor; }

std::size_t ClusterConsumer::pooled() const { return state_->pool.size(); }

asio::awaitable<Result<ClusterOutcome>> ClusterConsumer::fetch_to(std::string name, StreamDestination destination) {
  auto state = state_;
  // Named, not a temporary in the co_await: g++ 12 destroys those twice.
  const State::FetchFrom from_owner = [&](Consumer& consumer) -> asio::awaitable<Result<FetchOutcome>> {
    auto attempt = destination;  // each owner starts from a copy of it
    co_return co_await consumer.async_fetch_to(name, std::move(attempt));
  };
  co_return co_await state->fetch(name, from_owner);
}

asio::awaitable<Result<ClusterOutcome>> ClusterConsumer::fetch_into(std::string name, RegionGuard& destination) {
  auto state = state_;
  const State::FetchFrom from_owner = [&](Consumer& consumer) -> asio::awaitable<Result<FetchOutcome>> {
    co_return co_await consumer.async_fetch_into(name, destination);
  };
  co_return co_await state->fetch(name, from_owner);
}

}  // namespace corma
