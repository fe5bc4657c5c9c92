// A registry over a fresh test backend, and helpers the registry tests share.
#pragma once

#include "run.hpp"
#include "test_backend.hpp"

#include <corma/registry.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <future>

namespace corma::testing {

inline std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

class RegistryTest : public ::testing::Test {
 protected:
  static constexpr std::uint64_t default_budget = 64 * 4096;

  boost::asio::io_context io;
  std::shared_ptr<TestBackend> backend = TestBackend::create();

  // Operations a test left in the backend (a map held for 30 s, say) may be
  // answered into `io` by the backend's thread at any time; shutting the
  // backend down answers them all, on that thread, before `io` goes.
  void TearDown() override { (void)backend->async_shutdown(boost::asio::use_future).get(); }

  Registry make_registry(std::uint64_t budget = default_budget) {
    return Registry(backend, RegistryConfig{budget, 0});
  }

  /// Registers synchronously (the test thread waits on a future).
  static Result<RegionGuard> register_now(Registry& registry, std::span<std::byte> memory,
                                          Access access = Access::remote_read) {
    return registry.async_register(memory, access, boost::asio::use_future).get();
  }

  /// Waits for a region's release to be latched; false if it never was.
  static bool wait_released(const DeregisteredEvent& event,
                            std::chrono::seconds limit = std::chrono::seconds(5)) {
    auto future = event.async_wait(boost::asio::use_future);
    return future.wait_for(limit) == std::future_status::ready && future.get().has_value();
  }
};

}  // namespace corma::testing
