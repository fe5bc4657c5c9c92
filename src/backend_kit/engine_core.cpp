#include "backend_kit/engine_core.hpp"

#include <algorithm>
#include <bit>
#include <vector>

namespace corma::backend_kit {

EngineCore::EngineCore(EngineSettings s) : settings(std::move(s)) {}

// A progress executor may outlive the engine: its queue must not reach the
// io_context that dies with it.
EngineCore::~EngineCore() { commands_->close(); }

Error EngineCore::shut_down_error() const {
  return Error{errc::shutting_down, settings.name + " backend is shutting down"};
}

Error EngineCore::provider_error(errc code, const std::string& what) const {
  return Error{code, settings.name + ": " + what};
}

// ---- the progress loop ----

void EngineCore::quit() {
  quitting_ = true;
  work_.reset();
}

void EngineCore::loop() {
  // The loop is no handler of `io`: it drives `io` between provider progress
  // rounds (poll(), and run_one() to sleep), from outside. Work for the
  // progress executor goes through the command queue, which runs inline what
  // this thread dispatches to it, so a coroutine resumed at the end of a turn
  // pays no hand-off. (As a handler of its own io_context, the loop left what
  // this thread posted there in Asio's thread-private queue, which only a
  // nested poll() hands over, while the nested calls' work accounting ran the
  // count of outstanding work down to zero and stopped the context.)
  //
  // It is the one handler of a private io_context instead: Asio's recycling
  // allocator keeps its per-thread cache only on a thread inside some run(),
  // so ops, coroutine frames and hand-offs freed here are reused by the next
  // ones rather than going back to malloc; `io` sees a thread that is not
  // running it.
  asio::io_context host(1);
  asio::post(host, [this] {
    CommandQueue::ProgressThreadScope on_this_thread(*commands_);
    run_until_quit();
    // Whatever was queued before the end (late commands, cancelled timers)
    // runs now and is answered shutting_down, so no handler outlives the loop
    // holding the engine; what comes later is dropped.
    {
      detail::BulkHandoff bulk;
      while (commands_->run_all() + io.poll() != 0) bulk.flush();
    }
    commands_->close();
  });
  host.run();
}

void EngineCore::run_until_quit() {
  using clock = std::chrono::steady_clock;
  // io_context::poll() costs an epoll_wait (microseconds in a VM), so a
  // busy loop runs it at most this often: timers, fd watches and
  // cancellations are not latency-critical, while a spinning thread's
  // reaction to its provider is. Counted in time, not in turns: an idle
  // turn takes a fraction of a microsecond, and every sixteenth turn (as it
  // was) put an epoll_wait into most round trips over shared memory.
  constexpr auto poll_interval = std::chrono::microseconds(50);
  auto last_activity = clock::now();
  auto last_poll = last_activity;
  while (!quitting_) {
    // Completions of this turn go to each caller's executor together.
    detail::BulkHandoff bulk;
    turn_time_ = clock::now();
    const std::size_t commands = commands_->run_all();
    const std::size_t progressed = progress();
    std::size_t handlers = 0;
    if (turn_time_ - last_poll >= poll_interval) {
      handlers = io.poll();
      last_poll = turn_time_;
    }
    if (quitting_) break;
    // The turn's clock serves the spin decision too: one clock read per turn.
    if (commands != 0 || progressed != 0 || handlers != 0) {
      last_activity = turn_time_;
      continue;
    }
    if (!torn_down_) {
      const bool spinning = settings.progress == ProgressMode::busy_poll ||
                            (settings.progress == ProgressMode::adaptive && turn_time_ - last_activity < settings.spin_time);
      if (spinning) continue;
    }
    bulk.flush();  // before sleeping: nobody waits on this thread's sleep
    // Timers and fd watches that are due run before the thread sleeps.
    if (io.poll() != 0) continue;
    if (!commands_->prepare_to_sleep()) continue;
    if (!torn_down_ && !arm_for_sleep()) {  // events arrived meanwhile
      commands_->awake();
      continue;
    }
    io.run_one();  // a wake-up for a command, a timer, or the provider's event fd
    commands_->awake();
    last_activity = clock::now();
  }
}

// ---- shutdown ----

void EngineCore::run_shutdown(const std::shared_ptr<VoidOp>& op) {
  if (torn_down_) {
    if (op) answer(*op, success());
    return;
  }
  closing_ = true;
  inbox_.close(shut_down_error());
  // Maps registered but not yet answered are undone.
  undo_delayed_maps();
  stop_registration_thread();
  // Transfers in flight get until the deadline to finish.
  progress_until([this] { return transfers_idle(); });
  close_peers();
  // Whatever the provider did not complete is answered now; tearing the
  // provider down ends it.
  fail_unfinished_transfers();
  unmap_all();
  tear_down();
  drop_transfers();
  if (op) answer(*op, success());
}

// ---- map / unmap ----

void EngineCore::run_map(const std::shared_ptr<MapOp>& op) {
  if (op->cancelled.load(std::memory_order_acquire)) {
    return answer(*op, fail(errc::cancelled, "map cancelled before it ran"));
  }
  if (closed()) return answer(*op, shut_down_error());
  if (auto valid = validate_range(op->ptr, op->len); !valid) return answer(*op, std::move(valid).error());
  if (maps_off_thread(op->len)) return map_off_thread(op);
  if (op->len < settings.off_thread_map_bytes) return finish_map(op, register_in_provider(*op));
  const auto started = std::chrono::steady_clock::now();
  auto registered = register_in_provider(*op);
  note_map_time(op->len, std::chrono::steady_clock::now() - started);
  finish_map(op, std::move(registered));
}

bool EngineCore::maps_off_thread(std::size_t len) const noexcept {
  if (len < settings.off_thread_map_bytes) return false;
  const auto seen = map_ns_by_size_class_[std::bit_width(len)];
  return seen == 0 || std::chrono::nanoseconds(seen) >= settings.inline_map_limit;
}

void EngineCore::note_map_time(std::size_t len, std::chrono::nanoseconds took) noexcept {
  map_ns_by_size_class_[std::bit_width(len)] = std::max<std::uint64_t>(static_cast<std::uint64_t>(took.count()), 1);
}

Result<EngineCore::Registration> EngineCore::register_in_provider(const MapOp& op) {
  if (provider_map_hook) provider_map_hook(op.len);
  return provider_map(op.ptr, op.len, op.access);
}

void EngineCore::map_off_thread(const std::shared_ptr<MapOp>& op) {
  if (!registrar_) registrar_.emplace(1);
  // `this`: the registrar is joined by the shutdown, which every engine
  // runs before it is destroyed (stop_registration_thread), and the turn
  // it posts lives in our own io_context.
  asio::post(*registrar_, [this, op] {
    const auto started = std::chrono::steady_clock::now();
    auto registered = registrar_stopping_.load(std::memory_order_acquire) ? Result<Registration>(shut_down_error())
                      : op->cancelled.load(std::memory_order_acquire)
                          ? Result<Registration>(fail(errc::cancelled, "map cancelled before it ran"))
                          : register_in_provider(*op);
    const std::chrono::nanoseconds took = registered ? std::chrono::steady_clock::now() - started
                                                     : std::chrono::nanoseconds(0);
    {
      const std::lock_guard lock(registered_off_thread_mutex_);
      registered_off_thread_.push_back({op, std::move(registered), took});
    }
    asio::post(io, [this] { take_maps_registered_off_thread(); });
  });
}

void EngineCore::take_maps_registered_off_thread() {
  std::vector<RegisteredOffThread> done;
  {
    const std::lock_guard lock(registered_off_thread_mutex_);
    done.swap(registered_off_thread_);
  }
  for (auto& [op, registered, took] : done) {
    if (took.count() > 0) note_map_time(op->len, took);
    finish_map(op, std::move(registered));
  }
}

void EngineCore::stop_registration_thread() {
  if (!registrar_) return;
  // A map the provider is registering now ends as the provider decides;
  // those still queued are not started. Either way finish_map sees the
  // engine closed and undoes what was registered.
  registrar_stopping_.store(true, std::memory_order_release);
  registrar_->join();
  take_maps_registered_off_thread();
}

void EngineCore::finish_map(const std::shared_ptr<MapOp>& op, Result<Registration> registered) {
  if (!registered) return answer(*op, std::move(registered).error());
  auto& reg = registered.value();
  if (closed()) {
    // Registered off the progress thread while the shutdown began.
    (void)provider_unmap(reg.handle);
    return answer(*op, shut_down_error());
  }
  const RegionId id{new_id()};
  regions_.emplace(id, Region{reg.handle, static_cast<std::byte*>(op->ptr), op->len, 0, false, {}});
  live_.fetch_add(1, std::memory_order_acq_rel);
  op->mapped = id;
  op->result = BackendRegion{id, reg.effective_addr, reg.effective_len, std::move(reg.packed_key)};
  if (const std::chrono::nanoseconds delay{map_answer_delay_ns.load(std::memory_order_acquire)};
      delay.count() > 0) {
    op->id = new_id();
    delayed_maps_.emplace(op->id, op);
    op->timer = std::make_unique<asio::steady_timer>(io, delay);
    // `this`: the handler lives in our own io_context, which the engine owns.
    op->timer->async_wait([this, op](boost::system::error_code ec) {
      if (!ec) deliver_map(op);
    });
    return;
  }
  deliver_map(op);
}

void EngineCore::deliver_map(const std::shared_ptr<MapOp>& op) {
  delayed_maps_.erase(op->id);
  if (op->answered) return;
  if (op->cancelled.load(std::memory_order_acquire)) {
    // Mapped but not yet answered: the total guarantee says undo it.
    release_region(*op->mapped);
    return answer(*op, fail(errc::cancelled, "map cancelled"));
  }
  op->answered = true;
  const RegionId id = *op->mapped;
  op->completion.dispatch_or_rollback(
      [weak = weak_from_this(), id] {
        if (auto self = weak.lock()) {
          asio::post(self->io, [weak, id] {
            if (auto alive = weak.lock()) alive->release_region(id);
          });
        }
      },
      std::move(op->result));
  maps_answered.fetch_add(1, std::memory_order_acq_rel);
}

void EngineCore::cancel_map(const std::shared_ptr<MapOp>& op) {
  // Not run yet, or being registered off the progress thread: run_map, the
  // registration thread or deliver_map sees the flag. A map being
  // registered is answered only once the provider has let it go again, so
  // that the caller never frees memory the provider is still pinning.
  if (op->answered || !op->mapped) return;
  if (op->timer) op->timer->cancel();
  deliver_map(op);
}

void EngineCore::undo_delayed_maps() {
  auto delayed = std::move(delayed_maps_);
  delayed_maps_.clear();
  for (auto& [id, map] : delayed) {
    if (map->timer) map->timer->cancel();
    release_region(*map->mapped);
    answer(*map, shut_down_error());
  }
}

void EngineCore::release_region(RegionId id) {
  auto it = regions_.find(id);
  if (it == regions_.end() || torn_down_) return;
  if (it->second.transfers > 0) {
    it->second.unmapping = true;
    return;
  }
  unmap_now(it);
}

void EngineCore::unmap_now(RegionTable::iterator it) {
  auto unmapped = provider_unmap(it->second.handle);
  auto waiters = std::move(it->second.unmap_waiters);
  if (!unmapped) {
    it->second.unmapping = false;
    for (auto& w : waiters) answer(*w, unmapped.error());
    return;
  }
  regions_.erase(it);
  live_.fetch_sub(1, std::memory_order_acq_rel);
  for (auto& w : waiters) answer(*w, success());
}

void EngineCore::unmap_all() {
  for (auto it = regions_.begin(); it != regions_.end();) {
    (void)provider_unmap(it->second.handle);  // the provider is going away either way
    for (auto& w : it->second.unmap_waiters) answer(*w, success());
    it = regions_.erase(it);
  }
  live_.store(0, std::memory_order_release);
}

void EngineCore::run_unmap(const std::shared_ptr<VoidOp>& op, RegionId id) {
  if (closed()) return answer(*op, shut_down_error());
  auto it = regions_.find(id);
  if (it == regions_.end()) return answer(*op, success());  // idempotent
  it->second.unmap_waiters.push_back(op);
  if (it->second.transfers > 0) {
    it->second.unmapping = true;  // the last transfer out unmaps
    return;
  }
  unmap_now(it);
}

void EngineCore::cancel_unmap(const std::shared_ptr<VoidOp>& op) {
  answer(*op, fail(errc::cancelled, "unmap notification abandoned; the unmap proceeds"));
}

// ---- imported keys ----

Result<void> EngineCore::check_import(const PackedKey& key, std::size_t imported) const {
  if (closed()) return shut_down_error();
  if (key.empty() || key.size() > max_packed_key_size) return fail(errc::invalid_key, "packed key is empty or oversized");
  if (imported >= max_imported_keys_per_peer) {
    return fail(errc::budget_exceeded, "the peer already has " + std::to_string(imported) + " imported keys");
  }
  return success();
}

// ---- transfers ----

Result<EngineCore::Region*> EngineCore::admit_local(const TransferRequest& request) {
  if (closed()) return shut_down_error();
  if (request.len == 0) return fail(errc::out_of_range, "zero-length transfer");
  auto region = regions_.find(request.local);
  if (region == regions_.end() || region->second.unmapping) {
    return fail(errc::region_not_found, "local region is not registered");
  }
  CORMA_TRY(validate_local_range(request, region->second.len));
  return &region->second;
}

Result<EngineCore::Region*> EngineCore::admit_local(const TransferRequest& request, LastRegion& last) {
  if (last.region == nullptr || request.local != last.id) {
    CORMA_TRY(last.region, admit_local(request));
    last.id = request.local;
    return last.region;
  }
  // Open and registered, as the element before it found.
  CORMA_TRY(validate_local_range(request, last.region->len));
  return last.region;
}

void EngineCore::pin(RegionId id) {
  if (auto region = regions_.find(id); region != regions_.end()) ++region->second.transfers;
}

void EngineCore::note_transfer_started(Region* region) {
  if (region != nullptr) ++region->transfers;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  arm_deadline_sweep();
}

void EngineCore::unpin(RegionId id) {
  auto region = regions_.find(id);
  if (region != regions_.end() && --region->second.transfers == 0 && region->second.unmapping) {
    unmap_now(region);
  }
}

void EngineCore::arm_deadline_sweep() {
  if (sweep_armed_ || torn_down_) return;
  if (!deadline_sweep_) deadline_sweep_.emplace(io);
  sweep_armed_ = true;
  // A quarter of the timeout: a deadline is noticed at most 25 % late.
  const auto tick = std::clamp<std::chrono::milliseconds>(settings.operation_timeout / 4,
                                                          std::chrono::milliseconds(1),
                                                          std::chrono::milliseconds(1000));
  deadline_sweep_->expires_after(tick);
  // `this`, not a shared_ptr: the handler lives in our own io_context, so a
  // strong reference would keep the engine alive forever if the loop ended first.
  deadline_sweep_->async_wait([this](boost::system::error_code ec) {
    sweep_armed_ = false;
    if (!ec && !torn_down_ && answer_late_transfers(std::chrono::steady_clock::now())) arm_deadline_sweep();
  });
}

void EngineCore::stop_deadline_sweep() {
  if (deadline_sweep_) deadline_sweep_->cancel();
}

}  // namespace corma::backend_kit
