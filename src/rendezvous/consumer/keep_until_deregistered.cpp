#include "rendezvous/consumer/keep_until_deregistered.hpp"

#include <memory>

namespace corma::rendezvous {
namespace {

/// Gives up memory for good: a transfer into it may still be pending.
void leak(OwnedBuffer& buffer) { (void)buffer.leak(); }
void leak(std::shared_ptr<const void>& keepalive) {
  // Never deleted: the memory it keeps stays valid for the process's life.
  (void)new std::shared_ptr<const void>(std::move(keepalive));
}

/// Owns what keeps the memory while it waits; lets it go only when told
/// the memory is no longer registered.
template <class Kept>
struct Keeper {
  Kept kept;
  explicit Keeper(Kept k) : kept(std::move(k)) {}
  Keeper(const Keeper&) = delete;
  Keeper& operator=(const Keeper&) = delete;
  ~Keeper() {
    if (kept) leak(kept);
  }
};

template <class Kept>
void keep(Kept kept, const DeregisteredEvent& released) {
  auto keeper = std::make_unique<Keeper<Kept>>(std::move(kept));
  // A plain callback: it runs wherever the release is confirmed and holds
  // no work on any io_context, so nobody's run() waits for it (the release
  // may come only when the backend shuts down, after that run() returned).
  released.async_wait([keeper = std::move(keeper)](Result<void> done) mutable {
    if (done) keeper->kept = Kept{};
  });
}

}  // namespace

void keep_until_deregistered(OwnedBuffer buffer, const DeregisteredEvent& released) {
  keep(std::move(buffer), released);
}

void keep_until_deregistered(std::shared_ptr<const void> keepalive, const DeregisteredEvent& released) {
  keep(std::move(keepalive), released);
}

}  // namespace corma::rendezvous
