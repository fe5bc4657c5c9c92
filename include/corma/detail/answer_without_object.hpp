// Answering from an initiating function that has no operation object (and
// so no executor of its own) behind it.
#pragma once

#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>

#include <type_traits>
#include <utility>

namespace corma::detail {

/// Answers `handler` at once: posted to the handler's own executor, so never
/// inside the initiating function; a handler with no executor of its own
/// (its associated executor is Asio's system executor) runs here instead,
/// as detail::Completion::post() runs it, because corma starts no thread
/// (the system executor's pool) to answer it.
template <class Handler, class... Args>
void answer_without_object(Handler handler, Args... args) {
  if constexpr (std::is_same_v<boost::asio::associated_executor_t<Handler>, boost::asio::system_executor>) {
    std::move(handler)(std::move(args)...);
  } else {
    boost::asio::post(boost::asio::append(std::move(handler), std::move(args)...));
  }
}

}  // namespace corma::detail
