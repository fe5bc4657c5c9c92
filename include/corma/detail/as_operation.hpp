// A coroutine as an Asio asynchronous operation for any completion token
// (use_awaitable, a callback, deferred, use_future...). The rendezvous is
// written as coroutines; its public functions are initiating functions over
// them, as Registry's are over its callbacks.
#pragma once

#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>

#include <exception>
#include <optional>
#include <utility>

namespace corma::detail {

namespace asio = boost::asio;

/// `work` on a coroutine thread that reports cancellation through its
/// cancellation state instead of throwing at its next co_await (so the work
/// decides where stopping is safe). The optional only makes the result
/// default-constructible, as co_spawn requires.
template <class T>
asio::awaitable<std::optional<T>> without_throwing(asio::awaitable<T> work) {
  co_await asio::this_coro::throw_if_cancelled(false);
  co_return co_await std::move(work);
}
inline asio::awaitable<void> without_throwing(asio::awaitable<void> work) {
  co_await asio::this_coro::throw_if_cancelled(false);
  co_await std::move(work);
}

/// What an operation producing T completes with.
template <class T>
struct completion_signature {
  using type = void(T);
};
template <>
struct completion_signature<void> {
  using type = void();
};

/// Starts `work` on `executor` as its own coroutine thread, completing with
/// signature void(T) (void() for awaitable<void>) through `token`. The
/// caller's cancellation slot (the handler's associated slot) reaches the
/// coroutine; the result is handed to the handler on its associated
/// executor (by default `executor`). An exception escaping `work` is
/// rethrown from the handler's executor, as co_await would rethrow it.
template <class T, class Token>
auto as_operation(asio::any_io_executor executor, asio::awaitable<T> work, Token&& token) {
  return asio::async_initiate<Token, typename completion_signature<T>::type>(
      [executor](auto handler, asio::awaitable<T> coroutine) {
        auto slot = asio::get_associated_cancellation_slot(handler);
        auto handler_executor = asio::get_associated_executor(handler, executor);
        auto deliver = [handler = std::move(handler)](std::exception_ptr failure, auto... result) mutable {
          if (failure) std::rethrow_exception(failure);
          std::move(handler)(std::move(*result)...);
        };
        auto completion = asio::bind_cancellation_slot(slot, asio::bind_executor(handler_executor, std::move(deliver)));
        // without_throwing's result: an optional<T> (empty only with an
        // exception), or nothing for void.
        asio::co_spawn(executor, without_throwing(std::move(coroutine)), std::move(completion));
      },
      token, std::move(work));
}

}  // namespace corma::detail
