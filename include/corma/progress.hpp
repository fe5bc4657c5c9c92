// How a backend's progress thread waits for work. Shared by every backend
// that owns a provider on its own thread (UCX, verbs).
#pragma once

namespace corma {

enum class ProgressMode {
  busy_poll,  ///< never sleeps: lowest latency, one core always busy
  adaptive,   ///< spins for a while after the last activity, then sleeps on the provider's event fd
  event,      ///< sleeps on the provider's event fd as soon as there is nothing to do
};

}  // namespace corma
