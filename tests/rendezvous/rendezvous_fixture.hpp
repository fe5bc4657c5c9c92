// The rendezvous tests' common ground: an Owner and Consumers over loopback
// TCP with the in-process test backend, and a raw client that speaks the
// protocol frame by frame, as a hostile peer would.
#pragma once

#include "support/run.hpp"
#include "support/test_backend.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>

#include "rendezvous/protocol/framed_connection.hpp"
#include "support/raw_client.hpp"

#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

namespace corma::testing::rendezvous {

namespace asio = boost::asio;
namespace rv = corma::rendezvous;
using corma::Registry;
using corma::testing::message;
using corma::testing::RawClient;

inline std::vector<std::byte> pattern(std::size_t size, unsigned seed) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed) % 251);
  return bytes;
}

class Rendezvous : public ::testing::Test {
 protected:
  asio::io_context io;
  std::shared_ptr<TestBackend> owner_backend = TestBackend::create();
  std::shared_ptr<TestBackend> consumer_backend = TestBackend::create();
  std::shared_ptr<Registry> owner_registry;
  std::shared_ptr<Registry> consumer_registry =
      std::make_shared<Registry>(consumer_backend, corma::RegistryConfig{1 << 30, 0});
  std::unique_ptr<Owner> owner;
  asio::ip::tcp::acceptor acceptor{io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  std::vector<std::byte> big = pattern(1 << 20, 1);
  std::vector<std::byte> small = pattern(1000, 2);
  /// The owner registry's settings but its budget (start_owner's).
  corma::RegistryConfig owner_registry_config;

  void start_owner(std::uint64_t budget = 64 << 20, corma::OwnerConfig config = {}) {
    auto registry_config = owner_registry_config;
    registry_config.budget_bytes = budget;
    owner_registry = std::make_shared<Registry>(owner_backend, registry_config);
    owner = std::make_unique<Owner>(io.get_executor(), owner_registry, config);
    owner->publish("big", corma::PublishedObject{big, nullptr});
    owner->publish("small", corma::PublishedObject{small, nullptr});
    asio::co_spawn(io, owner->serve(acceptor), asio::detached);
  }

  asio::awaitable<corma::Result<std::unique_ptr<Consumer>>> connect(std::shared_ptr<Registry> registry) {
    co_return co_await Consumer::connect(io.get_executor(), acceptor.local_endpoint(), std::move(registry));
  }

  /// A raw client speaking version 2 whose hello offered an RDMA peer of
  /// the consumer's test backend (the test closes `peer` when done).
  struct RdmaRawClient {
    RawClient client;
    corma::PeerId peer;
  };
  asio::awaitable<RdmaRawClient> rdma_raw_client() {
    auto offer = co_await consumer_backend->async_peer_offer(asio::use_awaitable);
    if (!offer) throw std::runtime_error(offer.error().message());
    auto client = co_await RawClient::connect(acceptor.local_endpoint());
    auto hello = message(rv::Hello{2, corma::testing::test_backend_id, offer.value().blob});
    auto greeted = co_await client.ask(std::move(hello));
    if (!greeted || !std::holds_alternative<rv::HelloOk>(greeted.value())) throw std::runtime_error("hello refused");
    co_return RdmaRawClient{std::move(client), offer.value().peer};
  }

  void TearDown() override {
    if (owner) owner->stop();
    acceptor.close();
    io.run_for(std::chrono::seconds(2));
  }
};

// ---- a raw client speaking the protocol (support/raw_client.hpp) ----

/// Collects what a sink receives, checking the chunks come in order.
struct CollectingSink {
  std::vector<std::byte> bytes;
  std::size_t calls = 0;
  std::size_t largest = 0;
  bool in_order = true;

  corma::ChunkSink sink() {
    return [this](std::uint64_t offset, std::span<const std::byte> chunk) -> corma::Result<void> {
      in_order = in_order && offset == bytes.size();
      bytes.insert(bytes.end(), chunk.begin(), chunk.end());
      ++calls;
      largest = std::max(largest, chunk.size());
      return corma::success();
    };
  }
};

/// Runs the owner until `done` holds or `limit` passes (looking every few
/// milliseconds); how long it took.
template <class Done>
asio::awaitable<std::chrono::milliseconds> until(Done done, std::chrono::seconds limit) {
  const auto start = std::chrono::steady_clock::now();
  asio::steady_timer tick(co_await asio::this_coro::executor);
  while (!done() && std::chrono::steady_clock::now() - start < limit) {
    tick.expires_after(std::chrono::milliseconds(5));
    co_await tick.async_wait(asio::use_awaitable);
  }
  co_return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}

/// A resolver that answers no look-up by itself, as one reading a cold file
/// would for a long while: it holds each look-up and answers it `cancelled`
/// only when the owner gives it up (emits the handler's cancellation slot).
/// What is still held at the end is answered then, so nothing waits.
class HeldLookUps {
 public:
  HeldLookUps() = default;
  HeldLookUps(const HeldLookUps&) = delete;
  HeldLookUps& operator=(const HeldLookUps&) = delete;
  ~HeldLookUps() {
    for (auto& [id, done] : held_) std::move(done)(corma::fail(errc::cancelled, "the test ended"));
  }

  /// For Owner::set_resolver (the owner calls it on its own executor, as
  /// the test runs it: nothing here needs a lock).
  corma::AsyncObjectResolver resolver() {
    return [this](std::string, corma::ResolveHandler done) {
      auto slot = asio::get_associated_cancellation_slot(done);
      const auto id = next_++;
      ++asked_;
      held_.emplace(id, std::move(done));
      if (!slot.is_connected()) return;  // nobody can give it up
      slot.assign([this, id](asio::cancellation_type) {
        auto found = held_.find(id);
        if (found == held_.end()) return;
        auto taken = std::move(found->second);
        held_.erase(found);
        ++given_up_;
        std::move(taken)(corma::fail(errc::cancelled, "given up"));
      });
    };
  }
  [[nodiscard]] std::size_t asked() const { return asked_; }
  [[nodiscard]] std::size_t given_up() const { return given_up_; }

 private:
  std::map<std::uint64_t, corma::ResolveHandler> held_;
  std::uint64_t next_ = 0;
  std::size_t asked_ = 0;
  std::size_t given_up_ = 0;
};

inline bool is_error(const corma::Result<rv::Message>& reply, errc code) {
  auto* error = reply ? std::get_if<rv::ErrorReply>(&reply.value()) : nullptr;
  return error != nullptr && error->code == static_cast<std::uint16_t>(code);
}

}  // namespace corma::testing::rendezvous
