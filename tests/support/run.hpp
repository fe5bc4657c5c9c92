// Running a test coroutine to completion on an io_context, with a bound.
#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>

namespace corma::testing {

/// Runs `task` on `io` until it finishes; throws if it threw or did not
/// finish within `limit` (a hang is a test failure, not a stuck suite).
inline void run(boost::asio::io_context& io, boost::asio::awaitable<void> task,
                std::chrono::seconds limit = std::chrono::seconds(20));

/// Runs `task` on `io` until it finishes; throws if it threw or did not
/// finish within `limit` (a hang is a test failure, not a stuck suite).
template <class T>
T run(boost::asio::io_context& io, boost::asio::awaitable<T> task,
      std::chrono::seconds limit = std::chrono::seconds(20)) {
  std::optional<T> result;
  run(io, [&]() -> boost::asio::awaitable<void> { result.emplace(co_await std::move(task)); }(), limit);
  return std::move(*result);
}

inline void run(boost::asio::io_context& io, boost::asio::awaitable<void> task,
                std::chrono::seconds limit) {
  bool done = false;
  std::exception_ptr error;
  boost::asio::co_spawn(io, std::move(task), [&](std::exception_ptr e) {
    error = e;
    done = true;
    io.stop();  // other work (servers, reapers) may keep the context busy
  });
  io.restart();  // a context that ran out of work before stays stopped otherwise
  io.run_for(limit);
  io.restart();
  if (error) std::rethrow_exception(error);
  if (!done) throw std::runtime_error("test coroutine did not finish in time");
}

}  // namespace corma::testing
