// corma demo: an owner and several consumers in one process on loopback,
// a generated data set, a budget some objects exceed, everything fetched
// concurrently and verified byte for byte.
#include "commands.hpp"
#include "sizes.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace corma::cli {

namespace asio = boost::asio;

namespace {

struct DemoObject {
  std::string name;
  std::vector<std::byte> bytes;
};

/// Deterministic, position-dependent content: a misplaced chunk shows.
std::vector<std::byte> make_content(std::size_t size, std::uint32_t seed) {
  std::vector<std::byte> bytes(size);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return bytes;
}

struct Row {
  std::string name;
  std::uint64_t size = 0;
  std::string path;
  std::string reason;
  double mb_per_s = 0;
  bool verified = false;
  std::string error;
};

}  // namespace

int run_demo() {
  constexpr std::uint64_t owner_budget = 40 << 20;  // some objects will not fit
  constexpr int consumers_count = 4;
  const std::size_t sizes[] = {4 << 10, 16 << 10, 96 << 10, 256 << 10, 1 << 20, 3 << 20,
                               8 << 20, 12 << 20, 24 << 20, 32 << 20, 48 << 20};
  std::vector<DemoObject> objects;
  std::uint32_t seed = 1;
  for (auto size : sizes) {
    objects.push_back({"object-" + std::to_string(seed) + "-" + format_size(size), make_content(size, seed)});
    for (auto& c : objects.back().name) c = c == ' ' ? '_' : c;
    ++seed;
  }

  // Trusted peers: owner and consumers are this one process, on loopback.
  const auto loopback = asio::ip::make_address("127.0.0.1");
  TransportOptions transport{"tcp", true, loopback};
  auto owner_backend = make_backend(transport);
  auto consumer_backend = make_backend(transport);
  if (!owner_backend || !consumer_backend) {
    std::fprintf(stderr, "corma demo: %s\n",
                 (owner_backend ? consumer_backend.error() : owner_backend.error()).message().c_str());
    return 1;
  }
  auto owner_registry = std::make_shared<Registry>(owner_backend.value().backend, RegistryConfig{owner_budget, 0});
  auto consumer_registry =
      std::make_shared<Registry>(consumer_backend.value().backend, RegistryConfig{1ULL << 30, 0});

  std::printf("corma demo: %zu objects from %s to %s, owner budget %s, %d consumers, UCX over tcp on loopback\n",
              objects.size(), format_size(sizes[0]).c_str(), format_size(sizes[std::size(sizes) - 1]).c_str(),
              format_size(owner_budget).c_str(), consumers_count);
  std::printf("corma demo: trusted peers (one process): RDMA is on; objects under 64 KiB and those the budget\n"
              "            cannot hold at the moment of asking take the chunked path\n\n");

  asio::io_context io(1);
  Owner owner(io.get_executor(), owner_registry);
  for (const auto& object : objects) owner.publish(object.name, PublishedObject{object.bytes, nullptr});
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(loopback, 0));
  const auto endpoint = acceptor.local_endpoint();
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);

  std::vector<Row> rows(objects.size());
  int remaining = consumers_count;
  auto consumer_task = [&](int index) -> asio::awaitable<void> {
    auto consumer = co_await Consumer::connect(io.get_executor(), endpoint, consumer_registry);
    for (std::size_t i = static_cast<std::size_t>(index); i < objects.size(); i += consumers_count) {
      Row& row = rows[i];
      row.name = objects[i].name;
      row.size = objects[i].bytes.size();
      if (!consumer) {
        row.error = consumer.error().message();
        continue;
      }
      const auto start = std::chrono::steady_clock::now();
      auto fetched = co_await consumer.value()->async_fetch(objects[i].name);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!fetched) {
        row.error = fetched.error().message();
        continue;
      }
      row.path = to_string(fetched.value().path);
      row.reason = fetched.value().reason;
      row.mb_per_s = static_cast<double>(row.size) / seconds / 1e6;
      row.verified = fetched.value().size == row.size &&
                     std::memcmp(fetched.value().data.data(), objects[i].bytes.data(), row.size) == 0;
    }
    if (--remaining == 0) {
      owner.stop();
      acceptor.close();
    }
  };
  for (int c = 0; c < consumers_count; ++c) asio::co_spawn(io, consumer_task(c), asio::detached);
  const auto start = std::chrono::steady_clock::now();
  io.run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("%-24s %10s %8s %-18s %10s %s\n", "object", "size", "path", "reason", "MB/s", "verified");
  std::uint64_t total = 0;
  int verified = 0, rdma = 0, chunked = 0;
  for (const auto& row : rows) {
    if (!row.error.empty()) {
      std::printf("%-24s %10s  FAILED: %s\n", row.name.c_str(), format_size(row.size).c_str(), row.error.c_str());
      continue;
    }
    std::printf("%-24s %10s %8s %-18s %10.1f %s\n", row.name.c_str(), format_size(row.size).c_str(), row.path.c_str(),
                row.reason.empty() ? "-" : row.reason.c_str(), row.mb_per_s, row.verified ? "yes" : "NO");
    total += row.size;
    verified += row.verified ? 1 : 0;
    (row.path == "rdma" ? rdma : chunked) += 1;
  }
  const auto stats = owner.stats();
  std::printf("\ntotal: %s in %.2f s (%.1f MB/s), %d/%zu verified, %d over rdma, %d chunked; "
              "owner: %llu leases expired, %llu live, registered now %s\n",
              format_size(total).c_str(), seconds, static_cast<double>(total) / seconds / 1e6, verified,
              rows.size(), rdma, chunked, static_cast<unsigned long long>(stats.leases_expired),
              static_cast<unsigned long long>(stats.live_leases),
              format_size(owner_registry->stats().registered_bytes).c_str());
  const bool ok = verified == static_cast<int>(rows.size()) && rdma > 0 && chunked > 0;
  if (!ok) std::printf("corma demo: FAILED (every object must verify, and both paths must be used)\n");
  return ok ? 0 : 1;
}

}  // namespace corma::cli
