#include "metrics_server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <prometheus/text_serializer.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

namespace corma::cli {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

/// Advances `counter` to `value`; a counter never goes back.
void advance(prometheus::Counter& counter, std::uint64_t value) {
  const auto target = static_cast<double>(value);
  if (target > counter.Value()) counter.Increment(target - counter.Value());
}

/// The latency histogram's upper bounds in seconds: 1 µs, 2 µs, ... (the
/// last bucket of LatencyHistogram is +Inf).
prometheus::Histogram::BucketBoundaries latency_bounds() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (std::size_t i = 0; i + 1 < LatencyHistogram::bucket_count; ++i) {
    bounds.push_back(std::ldexp(1e-6, static_cast<int>(i)));
  }
  return bounds;
}

}  // namespace

template <class Stats>
void OwnerMetrics::Bound<Stats>::update(const Stats& stats) const {
  for (const auto& [counter, field] : counters) advance(*counter, stats.*field);
  for (const auto& [gauge, field] : gauges) gauge->Set(static_cast<double>(stats.*field));
}

OwnerMetrics::OwnerMetrics(bool with_registry, bool with_directory) {
  auto counter = [this](const char* name, const char* help) -> auto& {
    return BuildCounter().Name(name).Help(help).Register(families_);
  };
  auto gauge = [this](const char* name, const char* help) -> auto& {
    return BuildGauge().Name(name).Help(help).Register(families_);
  };
  auto owner_counter = [&](const char* name, const char* help, std::uint64_t OwnerStats::*field) {
    owner_.counters.emplace_back(&counter(name, help).Add({}), field);
  };
  auto owner_gauge = [&](const char* name, const char* help, std::uint64_t OwnerStats::*field) {
    owner_.gauges.emplace_back(&gauge(name, help).Add({}), field);
  };

  decisions_ = &counter("corma_owner_decisions_total",
                        "Acquire requests answered with a lease, by path (rdma or chunked) and the reason for it.");
  granted_ = &decisions_->Add({{"path", "rdma"}, {"reason", "granted"}});
  owner_counter("corma_owner_not_found_total", "Acquire requests for a name the owner does not serve.",
                &OwnerStats::not_found);
  owner_counter("corma_owner_pulls_total", "Chunks sent in answer to pulls.", &OwnerStats::pulls);
  owner_counter("corma_owner_pulled_bytes_total", "Bytes sent in answer to pulls.", &OwnerStats::pulled_bytes);
  owner_counter("corma_owner_refused_requests_total",
                "Requests refused: forged leases and renews, out-of-range pulls, unsupported protocol versions, "
                "malformed frames, lease caps.",
                &OwnerStats::refused_requests);
  owner_counter("corma_owner_leases_expired_total", "Leases ended because they were not renewed in time.",
                &OwnerStats::leases_expired);
  owner_counter("corma_owner_leases_released_total", "Leases ended by the consumer's release.",
                &OwnerStats::leases_released);
  owner_counter("corma_owner_connections_total", "Connections accepted.", &OwnerStats::connections);
  owner_counter("corma_owner_refused_connections_total",
                "Connections turned away at the connection or handshake cap.", &OwnerStats::refused_connections);
  owner_counter("corma_owner_exports_registered_total", "Registrations made to export an object for RDMA leases.",
                &OwnerStats::exports_registered);
  owner_counter("corma_owner_exports_evicted_total",
                "Cached exports deregistered to make room in the registration budget.",
                &OwnerStats::exports_evicted);
  owner_counter("corma_owner_windows_total",
                "RDMA windows registered for objects larger than the registration budget holds.",
                &OwnerStats::windows);
  owner_counter("corma_owner_batch_requests_total", "acquire_many and release_many requests answered.",
                &OwnerStats::batch_requests);
  owner_gauge("corma_owner_open_connections", "Connections being served now.", &OwnerStats::open_connections);
  owner_gauge("corma_owner_live_leases", "Leases held by consumers now.", &OwnerStats::live_leases);
  if (with_directory) {
    auto directory_counter = [&](const char* name, const char* help, std::uint64_t DirectoryStats::*field) {
      directory_.counters.emplace_back(&counter(name, help).Add({}), field);
    };
    directory_counter("corma_directory_etcd_requests_total", "Requests sent to etcd.",
                      &DirectoryStats::etcd_requests);
    directory_counter("corma_directory_etcd_failures_total",
                      "Calls to etcd that failed (unreachable, timed out, refused); retried later.",
                      &DirectoryStats::etcd_failures);
    directory_counter("corma_directory_leases_granted_total",
                      "Leases granted for the announcement: more than one means etcd lost one and the owner "
                      "was announced again.",
                      &DirectoryStats::leases_granted);
    directory_counter("corma_directory_resolutions_total", "Names resolved to their owners.",
                      &DirectoryStats::resolutions);
    directory_counter("corma_directory_cache_hits_total", "Resolutions answered from the cache.",
                      &DirectoryStats::cache_hits);
    directory_counter("corma_directory_stale_resolutions_total",
                      "Resolutions answered from an old cache entry because etcd could not be reached.",
                      &DirectoryStats::stale_resolutions);
    directory_counter("corma_directory_rejected_entries_total",
                      "Owner entries skipped because no consumer could rank or reach what they say (each owner "
                      "and entry once).",
                      &DirectoryStats::rejected_entries);
    announced_ = &gauge("corma_directory_announced", "1 while the owner's announcement is in etcd.").Add({});
    watching_ = &gauge("corma_directory_watching",
                       "1 while the watch that keeps the resolution cache fresh is live.")
                     .Add({});
  }
  if (!with_registry) return;

  auto registry_counter = [&](prometheus::Family<prometheus::Counter>& family, const prometheus::Labels& labels,
                              std::uint64_t RegistryStats::*field) {
    registry_.counters.emplace_back(&family.Add(labels), field);
  };
  auto registry_gauge = [&](const char* name, const char* help, std::uint64_t RegistryStats::*field) {
    registry_.gauges.emplace_back(&gauge(name, help).Add({}), field);
  };
  registry_gauge("corma_registry_budget_bytes", "Bytes the registry may keep registered at once.",
                 &RegistryStats::budget_bytes);
  registry_gauge("corma_registry_registered_bytes", "Bytes (whole pages) registered for live regions.",
                 &RegistryStats::registered_bytes);
  registry_gauge("corma_registry_reserved_bytes", "Bytes of the budget held for registrations in progress.",
                 &RegistryStats::reserved_bytes);
  registry_gauge("corma_registry_regions", "Live registered regions.", &RegistryStats::regions);
  registry_counter(counter("corma_registry_registrations_total", "Successful registrations."), {},
                   &RegistryStats::registrations);
  registry_counter(counter("corma_registry_deregistrations_total", "Confirmed deregistrations."), {},
                   &RegistryStats::deregistrations);
  auto& failed = counter("corma_registry_failed_registrations_total",
                         "Registrations that did not succeed, by reason: budget_exceeded, shutting_down, invalid "
                         "(a bad range), cancelled, backend (the backend refused).");
  registry_counter(failed, {{"reason", "budget_exceeded"}}, &RegistryStats::refused_budget);
  registry_counter(failed, {{"reason", "shutting_down"}}, &RegistryStats::refused_shutting_down);
  registry_counter(failed, {{"reason", "invalid"}}, &RegistryStats::refused_invalid);
  registry_counter(failed, {{"reason", "cancelled"}}, &RegistryStats::cancelled);
  registry_counter(failed, {{"reason", "backend"}}, &RegistryStats::failed_backend);
  registry_counter(counter("corma_registry_unconfirmed_unmaps_total",
                           "Deregistrations the backend did not confirm."),
                   {}, &RegistryStats::unconfirmed_unmaps);
  registry_counter(counter("corma_registry_leaked_owned_buffers_total",
                           "Registry-owned buffers never freed because their release was not confirmed."),
                   {}, &RegistryStats::leaked_owned_buffers);
  registry_counter(counter("corma_registry_cache_hits_total",
                           "Registrations served by sharing a cached registration (no backend call)."),
                   {}, &RegistryStats::cache_hits);
  registry_counter(counter("corma_registry_cache_misses_total",
                           "Registrations the registration cache could not serve (cache on only)."),
                   {}, &RegistryStats::cache_misses);
  registry_counter(counter("corma_registry_cache_evictions_total",
                           "Idle cached registrations deregistered to stay in their share or make room."),
                   {}, &RegistryStats::cache_evictions);
  registry_gauge("corma_registry_cache_idle_bytes", "Bytes charged to cached registrations no guard uses.",
                 &RegistryStats::cache_idle_bytes);
  registry_gauge("corma_registry_arenas", "Arenas whose registration is live.", &RegistryStats::arenas);
  registry_gauge("corma_registry_arena_capacity_bytes", "Memory of the live arenas.",
                 &RegistryStats::arena_capacity_bytes);
  registry_gauge("corma_registry_arena_allocated_bytes", "Bytes of arena slices handed out, by their class's size.",
                 &RegistryStats::arena_allocated_bytes);
  registry_gauge("corma_registry_arena_slices", "Arena slices handed out and not yet back.",
                 &RegistryStats::arena_slices);
  latency_ = &prometheus::BuildHistogram()
                  .Name("corma_registration_latency_seconds")
                  .Help("Time each successful registration took, from the request to the registered region.")
                  .Register(families_)
                  .Add({}, latency_bounds());
}

void OwnerMetrics::update(const OwnerStats& owner, const RegistryStats* registry, const DirectoryStats* directory) {
  advance(*granted_, owner.decisions.rdma);
  for (const auto& [reason, count] : owner.decisions.chunked_by_reason) {
    advance(decisions_->Add({{"path", "chunked"}, {"reason", reason}}), count);
  }
  owner_.update(owner);
  if (directory != nullptr && announced_ != nullptr) {
    directory_.update(*directory);
    announced_->Set(directory->announced ? 1 : 0);
    watching_->Set(directory->watching ? 1 : 0);
  }
  if (registry == nullptr || latency_ == nullptr) return;
  registry_.update(*registry);
  // The histogram takes what was added since the last scrape.
  const auto& now = registry->registration_latency;
  std::vector<double> added(LatencyHistogram::bucket_count);
  for (std::size_t i = 0; i < added.size(); ++i) {
    if (now.counts[i] > last_latency_.counts[i]) {
      added[i] = static_cast<double>(now.counts[i] - last_latency_.counts[i]);
      last_latency_.counts[i] = now.counts[i];
    }
  }
  std::chrono::duration<double> added_sum{0};
  if (now.sum > last_latency_.sum) {
    added_sum = now.sum - last_latency_.sum;
    last_latency_.sum = now.sum;
  }
  latency_->ObserveMultiple(added, added_sum.count());
}

std::string OwnerMetrics::render() const {
  return prometheus::TextSerializer().Serialize(families_.Collect());
}

std::string render_metrics(const OwnerStats& owner, const RegistryStats* registry, const DirectoryStats* directory) {
  OwnerMetrics metrics(registry != nullptr, directory != nullptr);
  metrics.update(owner, registry, directory);
  return metrics.render();
}

namespace {

asio::awaitable<void> answer(asio::ip::tcp::socket socket, std::shared_ptr<OwnerMetrics> metrics, const Owner& owner,
                             const Registry* registry, const Directory* directory) {
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
    response.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    const auto registry_stats = registry != nullptr ? std::optional(registry->stats()) : std::nullopt;
    const auto directory_stats = directory != nullptr ? std::optional(directory->stats()) : std::nullopt;
    metrics->update(owner.stats(), registry_stats ? &*registry_stats : nullptr,
                    directory_stats ? &*directory_stats : nullptr);
    response.body() = metrics->render();
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

asio::awaitable<void> serve_metrics(asio::ip::tcp::acceptor& acceptor, const Owner& owner, const Registry* registry,
                                    const Directory* directory) {
  // Shared with the answers, which may finish after this loop ends.
  auto metrics = std::make_shared<OwnerMetrics>(registry != nullptr, directory != nullptr);
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (!acceptor.is_open() || ec == asio::error::operation_aborted) co_return;
      continue;
    }
    asio::co_spawn(acceptor.get_executor(), answer(std::move(socket), metrics, owner, registry, directory),
                   asio::detached);
  }
}

}  // namespace corma::cli
