// Answering from an initiating function that has no operation object (and
// so no executor of its own) behind it.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/post.hpp>

#include <type_traits>
#include <utility>

namespace corma::detail {

/// Answers `handler` at once: posted to the executor the caller gave it (its
/// associated executor), so never inside the initiating function. A handler
/// the caller gave no executor runs here instead, as detail::Completion::post()
/// runs it: corma starts no thread of its own to answer it.
template <class Handler, class... Args>
void answer_without_object(Handler handler, Args... args) {
  // An empty executor stands for "none given": what a handler brings is
  // returned in its place.
  auto given = boost::asio::get_associated_executor(handler, boost::asio::any_io_executor{});
  if constexpr (std::is_same_v<decltype(given), boost::asio::any_io_executor>) {
    if (!given) {
      std::move(handler)(std::move(args)...);
      return;
    }
  }
  boost::asio::post(given, boost::asio::append(std::move(handler), std::move(args)...));
}

}  // namespace corma::detail
