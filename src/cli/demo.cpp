// corma demo: an owner and several consumers in one process on loopback,
// a generated data set, a budget some objects exceed (lent in RDMA
// windows), a set of small blocks fetched as one batch, blocks the owner
// pushes into the consumer's memory with a notification each, everything
// fetched concurrently and verified byte for byte.
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
#include <span>
#include <string>
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
  /// The first fetch, cold (both sides register), with the other consumers
  /// fetching at the same time: a latency, not a rate.
  double first_ms = 0;
  /// A later fetch on its own, warm (the owner's export cached) into memory
  /// the consumer keeps registered: what one fetch moves per second.
  double alone_mb_per_s = 0;
  bool verified = false;
  std::string error;
  std::uint32_t windows = 0;
};

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

/// Small blocks (a KV cache's, say) fetched with one async_fetch_many.
constexpr std::size_t block_count = 256;
constexpr std::size_t block_size = 64 << 10;

std::string block_name(std::size_t i) { return "kv/block-" + std::to_string(i); }

/// Fetches every block into one registered region with one batch call and
/// checks each against `blocks`; then again, timed alone. The row says how
/// the set went.
asio::awaitable<Row> fetch_blocks(Consumer& consumer, Registry& registry, const std::vector<std::byte>& blocks) {
  Row row;
  row.name = std::to_string(block_count) + " x " + format_size(block_size) + " batch";
  row.size = blocks.size();
  std::vector<std::byte> landing(blocks.size());
  auto region = co_await registry.async_register(landing, Access::local, asio::use_awaitable);
  if (!region) {
    row.error = region.error().message();
    co_return row;
  }
  std::vector<std::string> names;
  std::vector<FetchSlot> slots;
  for (std::size_t i = 0; i < block_count; ++i) {
    names.push_back(block_name(i));
    slots.push_back(FetchSlot{&region.value(), i * block_size, block_size});
  }
  auto start = std::chrono::steady_clock::now();
  auto fetched = co_await consumer.async_fetch_many(names, slots);
  row.first_ms = milliseconds_since(start);
  if (!fetched) {
    row.error = fetched.error().message();
    co_return row;
  }
  std::size_t over_rdma = 0;
  for (const auto& outcome : fetched.value()) {
    if (!outcome) {
      row.error = outcome.error().message();
      co_return row;
    }
    over_rdma += outcome.value().path == Path::rdma ? 1 : 0;
  }
  row.path = over_rdma == block_count ? "rdma" : "mixed";
  row.reason = "one call";
  row.verified = std::memcmp(landing.data(), blocks.data(), blocks.size()) == 0;
  start = std::chrono::steady_clock::now();
  auto again = co_await consumer.async_fetch_many(std::move(names), std::move(slots));
  if (again) row.alone_mb_per_s = static_cast<double>(row.size) / milliseconds_since(start) / 1e3;
  (void)co_await region.value().async_deregister(asio::use_awaitable);
  co_return row;
}

/// Blocks the owner pushes (the prefill→decode shape): the consumer offers
/// one landing with a place for each, and takes each block's notification
/// as the part of a program that uses the blocks would, checking the block
/// is in place when it comes.
constexpr std::size_t pushed_count = 16;

asio::awaitable<Row> push_blocks(Consumer& consumer, Registry& registry, const std::vector<std::byte>& blocks) {
  Row row;
  row.name = std::to_string(pushed_count) + " x " + format_size(block_size) + " push";
  row.size = pushed_count * block_size;
  std::vector<std::byte> landing(row.size);
  auto region = co_await registry.async_register(landing, Access::remote_read_write, asio::use_awaitable);
  if (!region) {
    row.error = region.error().message();
    co_return row;
  }
  std::size_t in_place_when_notified = 0;
  // Each block's notification is taken as a reader of the blocks would,
  // and the block checked then.
  auto take_notification = [&]() -> asio::awaitable<void> {
    auto note = co_await registry.backend()->async_receive_notification(asio::use_awaitable);
    if (!note || note.value().tag >= pushed_count) co_return;
    const auto at = note.value().tag * block_size;
    in_place_when_notified += std::memcmp(landing.data() + at, blocks.data() + at, block_size) == 0 ? 1 : 0;
  };
  auto push_all = [&](bool notify) -> asio::awaitable<Result<std::size_t>> {
    std::size_t pushed = 0;
    for (std::size_t i = 0; i < pushed_count; ++i) {
      PushOptions options{i * block_size, notify ? std::optional<std::uint64_t>(i) : std::nullopt};
      auto outcome = co_await consumer.async_push_fetch(block_name(i), region.value(), options);
      if (!outcome) co_return std::move(outcome).error();
      pushed += outcome.value().pushed ? 1 : 0;
      if (notify && outcome.value().pushed) co_await take_notification();
    }
    co_return pushed;
  };
  auto start = std::chrono::steady_clock::now();
  auto pushed = co_await push_all(true);
  row.first_ms = milliseconds_since(start);
  if (!pushed) {
    row.error = pushed.error().message();
    co_return row;
  }
  row.path = pushed.value() == pushed_count ? "push" : "mixed";
  row.reason = std::to_string(in_place_when_notified) + " notified";
  row.verified = in_place_when_notified == pushed_count && std::memcmp(landing.data(), blocks.data(), row.size) == 0;
  start = std::chrono::steady_clock::now();
  if (co_await push_all(false)) row.alone_mb_per_s = static_cast<double>(row.size) / milliseconds_since(start) / 1e3;
  (void)co_await region.value().async_deregister(asio::use_awaitable);
  co_return row;
}

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
  std::printf("corma demo: trusted peers (one process): RDMA is on; objects under 64 KiB take the chunked path,\n"
              "            objects the budget cannot hold whole are lent in RDMA windows, and %zu blocks of %s\n"
              "            come in one batch call (async_fetch_many); %zu of them the owner pushes into the\n"
              "            consumer's memory, each with a notification (async_push_fetch)\n\n",
              block_count, format_size(block_size).c_str(), pushed_count);
  const auto blocks = make_content(block_count * block_size, 99);

  asio::io_context io(1);
  OwnerConfig owner_config;
  owner_config.accept_push = true;  // trusted: the consumers are this process
  Owner owner(io.get_executor(), owner_registry, owner_config);
  for (const auto& object : objects) owner.publish(object.name, PublishedObject{object.bytes, nullptr});
  for (std::size_t i = 0; i < block_count; ++i) {
    owner.publish(block_name(i), PublishedObject{std::span(blocks).subspan(i * block_size, block_size), nullptr});
  }
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(loopback, 0));
  const auto endpoint = acceptor.local_endpoint();
  asio::co_spawn(io, owner.serve(acceptor), asio::detached);

  // The largest object, which the budget cannot hold, and the batch of
  // blocks come last, once the others are done: then the whole budget is
  // there to share (cached exports nobody reads are given up for windows).
  std::vector<Row> rows(objects.size() + 2);  // the last two: the batch of blocks, the pushed blocks
  const std::size_t concurrent = objects.size() - 1;
  auto fetch_row = [&](Consumer& consumer, std::size_t i) -> asio::awaitable<void> {
    Row& row = rows[i];
    row.name = objects[i].name;
    row.size = objects[i].bytes.size();
    const auto start = std::chrono::steady_clock::now();
    auto fetched = co_await consumer.async_fetch(objects[i].name);
    row.first_ms = milliseconds_since(start);
    if (!fetched) {
      row.error = fetched.error().message();
      co_return;
    }
    row.path = to_string(fetched.value().path);
    row.reason = fetched.value().reason_text();
    row.windows = fetched.value().windows;
    if (row.windows > 0) row.reason = "in " + std::to_string(row.windows) + " windows";
    row.verified = fetched.value().size == row.size &&
                   std::memcmp(fetched.value().data.data(), objects[i].bytes.data(), row.size) == 0;
  };
  auto fetched_all = std::chrono::steady_clock::now();
  // Then each object once more, one at a time, into memory kept registered.
  auto time_alone = [&](Consumer& consumer) -> asio::awaitable<void> {
    std::vector<std::byte> landing(sizes[std::size(sizes) - 1]);
    auto region = co_await consumer_registry->async_register(landing, Access::local, asio::use_awaitable);
    if (!region) co_return;
    for (std::size_t i = 0; i < objects.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      auto fetched = co_await consumer.async_fetch_into(objects[i].name, region.value());
      if (fetched) rows[i].alone_mb_per_s = static_cast<double>(rows[i].size) / milliseconds_since(start) / 1e3;
    }
    (void)co_await region.value().async_deregister(asio::use_awaitable);
  };
  auto last_task = [&]() -> asio::awaitable<void> {
    auto consumer = co_await Consumer::connect(io.get_executor(), endpoint, consumer_registry);
    if (consumer) {
      co_await fetch_row(*consumer.value(), concurrent);
      rows[rows.size() - 2] = co_await fetch_blocks(*consumer.value(), *consumer_registry, blocks);
      rows.back() = co_await push_blocks(*consumer.value(), *consumer_registry, blocks);
      fetched_all = std::chrono::steady_clock::now();
      co_await time_alone(*consumer.value());
    } else {
      rows[concurrent].error = rows[rows.size() - 2].error = rows.back().error = consumer.error().message();
    }
    owner.stop();
    acceptor.close();
  };
  int remaining = consumers_count;
  auto consumer_task = [&](int index) -> asio::awaitable<void> {
    auto consumer = co_await Consumer::connect(io.get_executor(), endpoint, consumer_registry);
    for (std::size_t i = static_cast<std::size_t>(index); i < concurrent; i += consumers_count) {
      if (consumer) {
        co_await fetch_row(*consumer.value(), i);
      } else {
        rows[i] = Row{objects[i].name, objects[i].bytes.size(), "", "", 0, 0, false, consumer.error().message(), 0};
      }
    }
    if (--remaining == 0) asio::co_spawn(io, last_task(), asio::detached);
  };
  for (int c = 0; c < consumers_count; ++c) asio::co_spawn(io, consumer_task(c), asio::detached);
  const auto start = std::chrono::steady_clock::now();
  io.run();
  const double seconds = std::chrono::duration<double>(fetched_all - start).count();

  std::printf("%-24s %10s %8s %-18s %10s %10s %s\n", "object", "size", "path", "reason", "first ms", "alone MB/s",
              "verified");
  std::uint64_t total = 0;
  int verified = 0, rdma = 0, chunked = 0, windowed = 0, pushed = 0;
  for (const auto& row : rows) {
    if (!row.error.empty()) {
      std::printf("%-24s %10s  FAILED: %s\n", row.name.c_str(), format_size(row.size).c_str(), row.error.c_str());
      continue;
    }
    std::printf("%-24s %10s %8s %-18s %10.1f %10.1f %s\n", row.name.c_str(), format_size(row.size).c_str(),
                row.path.c_str(), row.reason.empty() ? "-" : row.reason.c_str(), row.first_ms, row.alone_mb_per_s,
                row.verified ? "yes" : "NO");
    total += row.size;
    verified += row.verified ? 1 : 0;
    (row.path == "chunked" ? chunked : rdma) += 1;
    pushed += row.path == "push" ? 1 : 0;
    windowed += row.windows > 0 ? 1 : 0;
  }
  const auto stats = owner.stats();
  std::printf("\nfirst ms: the first fetch of each object, cold (both sides register) and %d consumers at once;\n"
              "alone MB/s: a later fetch of it on its own, warm, into memory the consumer keeps registered\n",
              consumers_count);
  std::printf("\ntotal (first fetches): %s in %.2f s (%.1f MB/s), %d/%zu verified, %d over rdma (%d in windows, %d "
              "pushed), %d chunked; owner: %llu windows lent, %llu objects pushed, %llu leases expired, %llu live, "
              "registered now %s\n",
              format_size(total).c_str(), seconds, static_cast<double>(total) / seconds / 1e6, verified,
              rows.size(), rdma, windowed, pushed, chunked, static_cast<unsigned long long>(stats.windows),
              static_cast<unsigned long long>(stats.pushes),
              static_cast<unsigned long long>(stats.leases_expired),
              static_cast<unsigned long long>(stats.live_leases),
              format_size(owner_registry->stats().registered_bytes).c_str());
  const bool ok = verified == static_cast<int>(rows.size()) && rdma > 0 && chunked > 0 && windowed > 0 && pushed > 0;
  if (!ok) {
    std::printf("corma demo: FAILED (every object must verify, and both paths, windows and push must be used)\n");
  }
  return ok ? 0 : 1;
}

}  // namespace corma::cli
