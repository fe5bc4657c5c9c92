#include "shut_down.hpp"

#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstdio>

namespace corma::cli {

namespace asio = boost::asio;

asio::awaitable<bool> shut_down(std::shared_ptr<Registry> registry, std::string command) {
  auto backend_done = co_await registry->backend()->async_shutdown(asio::use_awaitable);
  if (!backend_done) {
    std::fprintf(stderr, "%s: backend shutdown: %s\n", command.c_str(), backend_done.error().message().c_str());
  }
  auto registry_done = co_await registry->async_shutdown(std::chrono::seconds(10), asio::use_awaitable);
  if (!registry_done) {
    std::fprintf(stderr, "%s: registry shutdown: %s\n", command.c_str(), registry_done.error().message().c_str());
  }
  co_return registry_done && backend_done;
}

}  // namespace corma::cli
