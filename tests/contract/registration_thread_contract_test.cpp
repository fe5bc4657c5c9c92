// The backend contract for registrations a provider is slow to make
// (docs/architecture.md, "Threads"): pinning a large region must not hold up
// the transfers of regions already registered, and a map cancelled while
// the provider registers it still leaves nothing behind. The slow provider
// is a hook (ContractSubject::set_provider_map_hook) that holds the
// registration of large regions until the test lets it go.
#include "contract/backend_contract.hpp"
#include "contract/contract_helpers.hpp"

#include <condition_variable>
#include <mutex>

namespace corma::contract {
namespace {

constexpr std::size_t large_region = 8 * MiB;

/// Holds the provider's registration of every region of `large_region`
/// bytes or more until release(), or for ten seconds at most: a backend
/// that registers on its progress thread must fail the test, not hang it.
class SlowProvider {
 public:
  explicit SlowProvider(ContractSubject& subject) {
    subject.set_provider_map_hook([state = state_](std::size_t length) {
      if (length < large_region) return;
      std::unique_lock lock(state->mutex);
      state->entered = true;
      state->changed.notify_all();
      state->changed.wait_for(lock, std::chrono::seconds(10), [&] { return state->released; });
    });
  }
  SlowProvider(const SlowProvider&) = delete;
  SlowProvider& operator=(const SlowProvider&) = delete;
  /// Lets the provider go. The hook stays installed (it may still be
  /// returning on the backend's thread), and holds nothing from now on.
  ~SlowProvider() { release(); }

  /// Whether a large registration reached the provider within the answer limit.
  [[nodiscard]] bool entered() {
    std::unique_lock lock(state_->mutex);
    return state_->changed.wait_for(lock, answer_limit, [&] { return state_->entered; });
  }
  void release() {
    std::lock_guard lock(state_->mutex);
    state_->released = true;
    state_->changed.notify_all();
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    bool entered = false;
    bool released = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

TEST_P(BackendContract, ALargeRegistrationDoesNotHoldUpTransfersOfOtherRegions) {
  auto large_buffer = OwnedBuffer::allocate(large_region);
  auto remote_buffer = OwnedBuffer::allocate(4 * KiB);
  auto local_buffer = OwnedBuffer::allocate(4 * KiB);
  Pair pair;
  ASSERT_NO_FATAL_FAILURE(connect(GetParam(), pair));
  if (!pair.initiator.set_provider_map_hook) {
    GTEST_SKIP() << "the subject cannot slow its provider's registration (set_provider_map_hook)";
  }
  auto& initiator = *pair.initiator.backend;
  auto& target = *pair.target.backend;
  auto remote = map(target, remote_buffer.data(), remote_buffer.size(), Access::remote_read);
  ASSERT_TRUE(remote) << describe(remote);
  auto local = map(initiator, local_buffer.data(), local_buffer.size(), Access::local);
  ASSERT_TRUE(local) << describe(local);
  fill(remote_buffer.data(), remote_buffer.size(), 7);

  std::optional<Result<BackendRegion>> mapped;
  {
    SlowProvider provider(pair.initiator);
    Answer<BackendRegion> large_map;
    initiator.async_map(large_buffer.data(), large_region, Access::remote_read, large_map.handler());
    ASSERT_TRUE(provider.entered()) << "the large map never reached the provider";

    // Two seconds: a get over loopback takes microseconds; a get queued
    // behind the registration would wait the hook's ten seconds.
    Answer<void> got;
    initiator.async_get(GetRequest{pair.peer, local.value().id, 0, address(remote_buffer.data()), remote_buffer.size(),
                                   remote.value().packed_key},
                        got.handler());
    const auto outcome = got.wait(std::chrono::seconds(2));
    const bool map_answered_meanwhile = large_map.wait(std::chrono::milliseconds(0)).has_value();
    provider.release();
    ASSERT_TRUE(outcome.has_value()) << "a get waited for the registration of another region";
    EXPECT_TRUE(*outcome) << describe(*outcome);
    EXPECT_TRUE(same_bytes(local_buffer.data(), remote_buffer.data(), remote_buffer.size()));
    EXPECT_FALSE(map_answered_meanwhile) << "the map was answered while the provider was still registering";
    mapped = large_map.wait();
  }
  ASSERT_TRUE(mapped.has_value()) << "the large map was never answered";
  ASSERT_TRUE(*mapped) << describe(*mapped);
  expect_covers(mapped->value(), large_buffer.data(), large_region, Access::remote_read);
  EXPECT_EQ(initiator.live_registrations(), 2u);
  EXPECT_TRUE(unmap(initiator, mapped->value().id));
  EXPECT_EQ(initiator.live_registrations(), 1u);
}

TEST_P(BackendContract, AMapCancelledWhileTheProviderRegistersItLeavesNothingBehind) {
  // Declared first: outlives the backend, whose thread posts into it.
  asio::io_context io;
  auto large_buffer = OwnedBuffer::allocate(large_region);
  auto subject = GetParam().make();
  if (!subject.set_provider_map_hook) {
    GTEST_SKIP() << "the subject cannot slow its provider's registration (set_provider_map_hook)";
  }
  auto& backend = *subject.backend;
  asio::cancellation_signal signal;
  std::optional<Result<BackendRegion>> outcome;
  int calls = 0;
  {
    SlowProvider provider(subject);
    backend.async_map(large_buffer.data(), large_region, Access::remote_read,
                      asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, [&](Result<BackendRegion> r) {
                                                     ++calls;
                                                     outcome = std::move(r);
                                                   })));
    ASSERT_TRUE(provider.entered()) << "the large map never reached the provider";
    signal.emit(asio::cancellation_type::terminal);  // io is not running: the slot is ours alone
    // Answered only once the provider has let the registration go again:
    // the caller may free the memory as soon as it is answered.
    io.restart();
    io.poll();
    EXPECT_FALSE(outcome.has_value()) << "answered while the provider still registered the memory";
  }
  ASSERT_TRUE(run_until(io, [&] { return outcome.has_value(); })) << "the cancelled map was never answered";
  EXPECT_TRUE(failed_with(*outcome, errc::cancelled)) << describe(*outcome);
  EXPECT_EQ(backend.live_registrations(), 0u) << "a cancelled map left a registration behind";
  drain(io);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace corma::contract
