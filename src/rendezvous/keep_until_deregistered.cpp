#include "keep_until_deregistered.hpp"

#include <memory>

namespace corma::rendezvous {
namespace {

/// Owns the buffer while it waits; frees it only when told the memory is
/// no longer registered.
struct Keeper {
  OwnedBuffer buffer;
  explicit Keeper(OwnedBuffer b) : buffer(std::move(b)) {}
  Keeper(const Keeper&) = delete;
  Keeper& operator=(const Keeper&) = delete;
  ~Keeper() {
    if (buffer) (void)buffer.leak();
  }
};

}  // namespace

void keep_until_deregistered(OwnedBuffer buffer, const DeregisteredEvent& released) {
  auto keeper = std::make_unique<Keeper>(std::move(buffer));
  // A plain callback: it runs wherever the release is confirmed and holds
  // no work on any io_context, so nobody's run() waits for it (the release
  // may come only when the backend shuts down, after that run() returned).
  released.async_wait([keeper = std::move(keeper)](Result<void> done) mutable {
    if (done) keeper->buffer = OwnedBuffer{};
  });
}

}  // namespace corma::rendezvous
