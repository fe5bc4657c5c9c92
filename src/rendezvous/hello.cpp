#include "hello.hpp"

#include <boost/asio/use_awaitable.hpp>

namespace corma::rendezvous {

boost::asio::awaitable<HelloAnswer> answer_hello(RdmaBackend* backend, Hello hello) {
  if (hello.version != protocol_version) {
    co_return HelloAnswer{ErrorReply{static_cast<std::uint16_t>(errc::protocol), "unsupported protocol version"}, {}};
  }
  HelloOk answer;
  std::optional<PeerId> peer;
  if (backend != nullptr && hello.backend != BackendId::none && hello.backend == backend->wire_id() &&
      !hello.peer_offer.empty()) {
    auto accepted = co_await backend->async_peer_accept(std::move(hello.peer_offer), boost::asio::use_awaitable);
    if (accepted) {
      answer.backend = hello.backend;
      answer.peer_answer = std::move(accepted.value().blob);
      peer = accepted.value().peer;
    }
  }
  co_return HelloAnswer{std::move(answer), peer};
}

}  // namespace corma::rendezvous
