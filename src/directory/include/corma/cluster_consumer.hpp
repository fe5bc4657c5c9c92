// ClusterConsumer: fetches by name from whichever owner serves it, found
// through a Directory, with one pooled connection per owner (made when
// first needed) and failover: a fetch its owner does not serve (the
// connection refused or closed, the owner silent past the io timeout,
// something other than corma on its port, a version or backend mismatch,
// the owner draining, refusing, or not holding the name) is tried on the
// next owner, once per owner. A cancellation, a range the object does not
// have, this side's own failure and a changed object end it at once. Once
// an owner may have written part of a version it announced, only owners
// announcing that same version take the fetch over, so bytes of two
// versions never meet in one destination. The outcome says which owner
// served it, the version, and why each owner before was left.
#pragma once

#include <corma/consumer.hpp>
#include <corma/detail/as_operation.hpp>
#include <corma/directory.hpp>
#include <corma/registry.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace corma {

/// Which part, and which version, of an object a fetch through the cluster
/// asks for. A range alone converts to it: the newest version's.
struct ClusterFetchOptions {
  ClusterFetchOptions() = default;
  ClusterFetchOptions(ByteRange part) : range(part) {}  // NOLINT(google-explicit-constructor)

  ByteRange range{};
  /// Only this version (Announcement::versions): the owners that announce
  /// another one, or none, are not asked, and a fetch no owner announces it
  /// for fails with `object_changed`. Empty: the newest announced.
  std::optional<std::uint64_t> version{};
};

/// How a fetch through the cluster went: the fetch's own outcome, the owner
/// that served it, and the owners tried before it and why they failed.
struct ClusterOutcome {
  FetchOutcome fetch;
  std::string owner;
  /// The version of the name the serving owner announced (empty: none).
  std::optional<std::uint64_t> version;
  struct Failed {
    std::string owner;
    Error error;
  };
  std::vector<Failed> failed;
};

/// async_fetch_many's answer: per name, its outcome and the owner that
/// served it.
struct ClusterManyFetched {
  ManyFetched outcomes;
  std::vector<std::string> owners;
};

class ClusterConsumer {
 public:
  using DefaultToken = Directory::DefaultToken;

  /// `registry` may be null: every object then comes in chunks.
  ClusterConsumer(boost::asio::any_io_executor executor, std::shared_ptr<Directory> directory,
                  std::shared_ptr<Registry> registry, ConsumerConfig config = {});
  ClusterConsumer(const ClusterConsumer&) = delete;
  ClusterConsumer& operator=(const ClusterConsumer&) = delete;
  ~ClusterConsumer();

  /// Fetches `name` into `destination` as Consumer::async_fetch_to would,
  /// from the first owner of the directory's order that serves it; an
  /// owner lost during the fetch is dropped from the pool and the next one
  /// tried (chunks already handed to the sink are handed again from the
  /// start: the sink writes at offsets). Errors that are the object's own
  /// (not found on every owner, object_changed, a sink's error) end the
  /// fetch. Completes with Result<ClusterOutcome>.
  template <class Token = DefaultToken>
    requires(!std::is_same_v<std::decay_t<Token>, ByteRange> &&
             !std::is_same_v<std::decay_t<Token>, ClusterFetchOptions>)
  auto async_fetch_to(std::string name, StreamDestination destination, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_to(std::move(name), std::move(destination), {}),
                                std::forward<Token>(token));
  }
  /// The same for a part of the object (Consumer::async_fetch_to's range),
  /// or for one version of it. Generations are each owner's own: the
  /// outcome's owner and generation together name what was read; its
  /// version is the one the owner announced.
  template <class Token = DefaultToken>
  auto async_fetch_to(std::string name, StreamDestination destination, ClusterFetchOptions options,
                      Token&& token = {}) {
    return detail::as_operation(executor(), fetch_to(std::move(name), std::move(destination), options),
                                std::forward<Token>(token));
  }

  /// The same into a region of the registry the caller keeps registered.
  template <class Token = DefaultToken>
    requires(!std::is_same_v<std::decay_t<Token>, ByteRange> &&
             !std::is_same_v<std::decay_t<Token>, ClusterFetchOptions>)
  auto async_fetch_into(std::string name, RegionGuard& destination, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_into(std::move(name), destination, {}),
                                std::forward<Token>(token));
  }
  template <class Token = DefaultToken>
  auto async_fetch_into(std::string name, RegionGuard& destination, ClusterFetchOptions options,
                        Token&& token = {}) {
    return detail::as_operation(executor(), fetch_into(std::move(name), destination, options),
                                std::forward<Token>(token));
  }

  /// Fetches every object of `names` into its slot (as
  /// Consumer::async_fetch_many), spread over the owners: each name goes to
  /// the first owner of its directory order, the names of one owner go in
  /// one async_fetch_many, and the owners' sets run at once. The objects of
  /// an owner lost meanwhile (or that did not have them) are planned again
  /// on their next owner, once per owner. One outcome per name, in order,
  /// and the owner that served each (empty where none did). Completes with
  /// Result<ClusterManyFetched>.
  template <class Token = DefaultToken>
  auto async_fetch_many(std::vector<std::string> names, std::vector<FetchSlot> slots, Token&& token = {}) {
    return detail::as_operation(executor(), fetch_many(std::move(names), std::move(slots)),
                                std::forward<Token>(token));
  }

  /// Owners connected now.
  [[nodiscard]] std::size_t pooled() const;

  struct State;

 private:
  [[nodiscard]] boost::asio::any_io_executor executor() const;
  [[nodiscard]] boost::asio::awaitable<Result<ClusterOutcome>> fetch_to(std::string name,
                                                                         StreamDestination destination,
                                                                         ClusterFetchOptions options);
  [[nodiscard]] boost::asio::awaitable<Result<ClusterOutcome>> fetch_into(std::string name, RegionGuard& destination,
                                                                           ClusterFetchOptions options);
  [[nodiscard]] boost::asio::awaitable<Result<ClusterManyFetched>> fetch_many(std::vector<std::string> names,
                                                                             std::vector<FetchSlot> slots);

  std::shared_ptr<State> state_;
};

}  // namespace corma
