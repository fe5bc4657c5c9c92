// The registrations an owner lends its objects through, by name: the one
// each name's leases read now, and the registrations under way, so that
// acquires of an object being registered wait for that registration
// instead of making their own. Used on the owner's executor alone (but the
// count of evictions, which the registry bumps from any thread).
#pragma once

#include "rendezvous/owner/name_map.hpp"

#include <corma/owner.hpp>
#include <corma/registry.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace corma::rendezvous {

/// One registration of an object, shared by every lease that reads it (and
/// by the export table, for published objects).
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

  /// Whether it registers exactly `object`'s bytes (a name may have been
  /// published again, or its file changed, since).
  [[nodiscard]] bool covers(const PublishedObject& object) const {
    const auto registered = guard.bytes();
    return registered.data() == object.bytes.data() && registered.size() == object.bytes.size();
  }

  RegionGuard guard;
  std::vector<std::byte> descriptor;
  std::shared_ptr<const void> keepalive;
};

class ExportTable {
 public:
  explicit ExportTable(boost::asio::any_io_executor executor) : executor_(std::move(executor)) {}

  /// The registration of `object` that another lease of `name` reads now;
  /// null when there is none (or it registers other bytes).
  [[nodiscard]] std::shared_ptr<Export> ready(const std::string& name, const PublishedObject& object) const;
  /// `exported` is what leases of `name` read from now on.
  void record(const std::string& name, std::shared_ptr<Export> exported);
  /// `name`'s current registration is handed out no more.
  void forget(const std::string& name) { current_.erase(name); }

  /// A registration of `name` under way; whoever waits for it (waiter())
  /// is woken however it ends.
  class Registering {
   public:
    Registering(ExportTable& table, std::string name);
    Registering(const Registering&) = delete;
    Registering& operator=(const Registering&) = delete;
    ~Registering();

   private:
    ExportTable& table_;
    std::string name_;
    std::shared_ptr<boost::asio::steady_timer> done_;
  };
  /// What to wait on for the registration of `name` under way (cancelled
  /// when it ends; it never expires); null when none is.
  [[nodiscard]] std::shared_ptr<boost::asio::steady_timer> waiter(const std::string& name) const;

  /// Counts a cached registration the registry let go for room.
  [[nodiscard]] std::function<void()> eviction_counter() const;
  [[nodiscard]] std::uint64_t evicted() const noexcept { return evicted_->load(std::memory_order_relaxed); }

 private:
  boost::asio::any_io_executor executor_;
  /// The registration each name's leases read now. Between leases a
  /// published object stays registered in the registry's cache, which
  /// also evicts it for room.
  NameMap<std::weak_ptr<Export>> current_;
  /// How many entries `current_` had after its last sweep of expired ones:
  /// it is swept again when it has doubled, so a server of many names
  /// (corma serve) keeps entries for the exports alive, not for every name
  /// it ever lent.
  std::size_t after_sweep_ = 0;
  NameMap<std::shared_ptr<boost::asio::steady_timer>> registering_;
  std::shared_ptr<std::atomic<std::uint64_t>> evicted_ = std::make_shared<std::atomic<std::uint64_t>>(0);
};

}  // namespace corma::rendezvous
