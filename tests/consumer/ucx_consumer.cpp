// Links against an installed corma::ucx: two backends over UCX shared memory
// in one process connect, one maps a buffer, the other gets it through a
// Registry and checks every byte, and both unmap and shut down.
#include <corma/registry.hpp>
#include <corma/ucx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace asio = boost::asio;

namespace {

template <class T>
T must(corma::Result<T> result, const char* what) {
  if (!result) throw std::runtime_error(std::string(what) + ": " + result.error().message());
  return std::move(result).value();
}

void must(corma::Result<void> result, const char* what) {
  if (!result) throw std::runtime_error(std::string(what) + ": " + result.error().message());
}

asio::awaitable<void> map_get_unmap(std::shared_ptr<corma::ucx::Backend> reader,
                                    std::shared_ptr<corma::ucx::Backend> owner) {
  constexpr auto token = asio::use_awaitable;
  auto offer = must(co_await reader->async_peer_offer(token), "peer offer");
  auto answer = must(co_await owner->async_peer_accept(offer.blob, token), "peer accept");
  must(co_await reader->async_peer_complete(offer.peer, answer.blob, token), "peer complete");

  std::vector<std::byte> source(64 * 1024);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 31 + 7);
  auto exported = must(co_await owner->async_map(source.data(), source.size(), corma::Access::remote_read, token),
                       "owner map");

  auto registry = std::make_shared<corma::Registry>(reader, corma::RegistryConfig{.budget_bytes = 1 << 20});
  std::vector<std::byte> destination(source.size());
  auto guard = must(co_await registry->async_register(std::span(destination), corma::Access::local, token),
                    "reader register");
  const corma::RemoteRegion remote{owner->wire_id(), 1, reinterpret_cast<std::uint64_t>(source.data()),
                                   source.size(), exported.packed_key};
  must(co_await guard.async_get(offer.peer, remote, {0, 0, source.size()}, token), "get");
  if (destination != source) throw std::runtime_error("the bytes read differ from the bytes mapped");

  must(co_await guard.async_deregister(token), "reader unmap");
  must(co_await owner->async_unmap(exported.id, token), "owner unmap");
  must(co_await registry->async_shutdown(std::chrono::seconds(5), token), "registry shutdown");
  must(co_await reader->async_shutdown(token), "reader shutdown");
  must(co_await owner->async_shutdown(token), "owner shutdown");
  std::printf("ucx consumer: mapped, read and checked %zu bytes over shared memory; live registrations %zu + %zu\n",
              source.size(), reader->live_registrations().value_or(99), owner->live_registrations().value_or(99));
}

}  // namespace

int main() {
  const corma::ucx::Config config{.transport = corma::ucx::Transport::shared_memory,
                                  .error_handling = corma::ucx::ErrorHandling::none};
  try {
    auto reader = must(corma::ucx::Backend::create(config), "reader backend");
    auto owner = must(corma::ucx::Backend::create(config), "owner backend");
    asio::io_context io;
    bool done = false;
    asio::co_spawn(io, map_get_unmap(reader, owner), [&](std::exception_ptr error) {
      if (error) std::rethrow_exception(error);
      done = true;
    });
    io.run_for(std::chrono::seconds(30));
    if (!done) throw std::runtime_error("did not finish within 30 s");
    if (reader->live_registrations() != 0u || owner->live_registrations() != 0u) {
      throw std::runtime_error("registrations left after shutdown");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ucx consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
