// Memory a provider may still write into, kept until its registration is
// really gone.
#pragma once

#include <corma/owned_buffer.hpp>
#include <corma/region_guard.hpp>

#include <memory>

namespace corma::rendezvous {

/// Frees `buffer` once `released` resolves, without anyone waiting for it.
/// If the event can never resolve (its registry and backend went away with
/// the registration unconfirmed), the buffer is leaked, never freed: a
/// transfer into it may still be pending.
void keep_until_deregistered(OwnedBuffer buffer, const DeregisteredEvent& released);
/// The same for memory whose owner `keepalive` is (never let go if the
/// event cannot resolve).
void keep_until_deregistered(std::shared_ptr<const void> keepalive, const DeregisteredEvent& released);

}  // namespace corma::rendezvous
