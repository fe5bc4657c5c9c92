// The caller's side of a provider-backed backend: each RdmaBackend::do_*
// builds its op, hooks cancellation and submits it to the engine (gets,
// puts and batches: TransferEngine's initiate_*, over the provider's op); creation
// starts the progress thread, destruction tears down on it. UCX and verbs
// backends forward to these, so the rules live in one place.
#pragma once

#include "backend_kit/engine_core.hpp"

#include <functional>
#include <memory>
#include <thread>

namespace corma::backend_kit {

using detail::Completion;

void initiate_map(EngineCore& engine, void* ptr, std::size_t len, Access access,
                  RdmaBackend::Handler<BackendRegion> h);
void initiate_unmap(EngineCore& engine, RegionId id, RdmaBackend::Handler<void> h);
void initiate_import_key(EngineCore& engine, PeerId peer, PackedKey key, RdmaBackend::Handler<RemoteKeyId> h);
void initiate_release_key(EngineCore& engine, RemoteKeyId key, RdmaBackend::Handler<void> h);
void initiate_peer_offer(EngineCore& engine, RdmaBackend::Handler<PeerOffer> h);
void initiate_peer_accept(EngineCore& engine, std::vector<std::byte> offer, RdmaBackend::Handler<PeerAnswer> h);
void initiate_peer_complete(EngineCore& engine, PeerId peer, std::vector<std::byte> answer,
                            RdmaBackend::Handler<void> h);
void initiate_peer_close(EngineCore& engine, PeerId peer, RdmaBackend::Handler<void> h);
void initiate_receive_notification(EngineCore& engine, RdmaBackend::Handler<Notification> h);
void initiate_shutdown(EngineCore& engine, RdmaBackend::Handler<void> h);

/// Starts the progress thread: it runs `start` (which creates the provider's
/// handles there, where they live) and, if that succeeded, the loop.
/// Returns the running thread or start's error (the thread then joined).
[[nodiscard]] Result<std::thread> start_progress_thread(const std::shared_ptr<EngineCore>& engine,
                                                        std::function<Result<void>()> start);

/// The destructor's teardown: refuse new commands, shut down and quit on the
/// progress thread, then join it (or, when called from it because the last
/// reference went inside a completion running there, hand it over to be
/// joined once it ends: see handed_over_threads.hpp).
void stop_progress_thread(const std::shared_ptr<EngineCore>& engine, std::thread& thread);

}  // namespace corma::backend_kit
