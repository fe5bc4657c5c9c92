#include "metrics_server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <sstream>

namespace corma::cli {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

std::string render_metrics(const OwnerStats& owner, const RegistryStats* registry) {
  std::ostringstream out;
  out << "# TYPE corma_owner_decisions_total counter\n";
  out << "corma_owner_decisions_total{path=\"rdma\",reason=\"granted\"} " << owner.decisions.rdma << "\n";
  for (const auto& [reason, count] : owner.decisions.chunked_by_reason) {
    out << "corma_owner_decisions_total{path=\"chunked\",reason=\"" << reason << "\"} " << count << "\n";
  }
  out << "# TYPE corma_owner_not_found_total counter\ncorma_owner_not_found_total " << owner.not_found << "\n";
  out << "# TYPE corma_owner_pulled_bytes_total counter\ncorma_owner_pulled_bytes_total " << owner.pulled_bytes << "\n";
  out << "# TYPE corma_owner_refused_requests_total counter\ncorma_owner_refused_requests_total "
      << owner.refused_requests << "\n";
  out << "# TYPE corma_owner_refused_connections_total counter\ncorma_owner_refused_connections_total "
      << owner.refused_connections << "\n";
  out << "# TYPE corma_owner_leases_expired_total counter\ncorma_owner_leases_expired_total "
      << owner.leases_expired << "\n";
  out << "# TYPE corma_owner_open_connections gauge\ncorma_owner_open_connections " << owner.open_connections
      << "\n";
  out << "# TYPE corma_owner_live_leases gauge\ncorma_owner_live_leases " << owner.live_leases << "\n";
  if (registry != nullptr) {
    out << "# TYPE corma_registry_registered_bytes gauge\ncorma_registry_registered_bytes "
        << registry->registered_bytes << "\n";
    out << "# TYPE corma_registry_budget_bytes gauge\ncorma_registry_budget_bytes " << registry->budget_bytes << "\n";
    out << "# TYPE corma_registry_regions gauge\ncorma_registry_regions " << registry->regions << "\n";
    out << "# TYPE corma_registration_latency_us histogram\n";
    std::uint64_t cumulative = 0;
    const auto& counts = registry->registration_latency.counts;
    for (std::size_t i = 0; i + 1 < counts.size(); ++i) {
      cumulative += counts[i];
      out << "corma_registration_latency_us_bucket{le=\"" << (std::uint64_t{1} << i) << "\"} " << cumulative << "\n";
    }
    cumulative += counts.back();
    out << "corma_registration_latency_us_bucket{le=\"+Inf\"} " << cumulative << "\n";
    out << "corma_registration_latency_us_count " << cumulative << "\n";
  }
  return out.str();
}

namespace {

asio::awaitable<void> answer(asio::ip::tcp::socket socket, const Owner& owner, const Registry* registry) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  stream.expires_after(std::chrono::seconds(10));
  auto [ec, bytes] = co_await http::async_read(stream, buffer, request, asio::as_tuple(asio::use_awaitable));
  if (ec) co_return;
  http::response<http::string_body> response;
  response.version(request.version());
  response.keep_alive(false);
  if (request.method() == http::verb::get && request.target() == "/metrics") {
    response.result(http::status::ok);
    response.set(http::field::content_type, "text/plain; version=0.0.4");
    const auto registry_stats = registry != nullptr ? std::optional(registry->stats()) : std::nullopt;
    response.body() = render_metrics(owner.stats(), registry_stats ? &*registry_stats : nullptr);
  } else {
    response.result(http::status::not_found);
    response.body() = "try /metrics\n";
  }
  response.prepare_payload();
  co_await http::async_write(stream, response, asio::as_tuple(asio::use_awaitable));
  beast::error_code ignored;
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
}

}  // namespace

asio::awaitable<void> serve_metrics(asio::ip::tcp::acceptor& acceptor, const Owner& owner, const Registry* registry) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (!acceptor.is_open() || ec == asio::error::operation_aborted) co_return;
      continue;
    }
    asio::co_spawn(acceptor.get_executor(), answer(std::move(socket), owner, registry), asio::detached);
  }
}

}  // namespace corma::cli
