#include "small_fetch_while_cold.hpp"

#include "bench_support.hpp"
#include "file_server.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

namespace corma::bench {

namespace {

constexpr std::size_t cold_size = 1024 * MiB;
constexpr std::size_t small_size = 4 * KiB;

/// Drops `path`'s pages from the page cache, so that its next read comes
/// from the disk (written back first: dirty pages cannot be dropped).
void drop_from_page_cache(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  ::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// Milliseconds each of `getter`'s fetches of "small.bin" took, fetching
/// until `count` are done or, with `while_running`, while it holds.
std::vector<double> small_fetches(FileGetter& getter, std::size_t count, const std::atomic<bool>* while_running) {
  std::vector<double> millis;
  while (while_running != nullptr ? while_running->load() : millis.size() < count) {
    const auto start = clock_type::now();
    auto fetched = must(getter.consumer->async_fetch("small.bin", boost::asio::use_future).get(), "small fetch");
    if (fetched.size != small_size) throw std::runtime_error("the small file came back wrong");
    millis.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - start).count());
  }
  return millis;
}

}  // namespace

Measurement small_fetch_while_cold(const Options& options) {
  Measurement m{"small_fetch_while_cold", "tcp", "size=1GiB", "ms", false, {}, {}, {}, true};
  m.baseline = "the same fetches alone";
  ServedDirectory dir(cold_size);
  {
    std::vector<std::byte> small(small_size, std::byte{7});
    const int fd = ::open((dir.root / "small.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ::write(fd, small.data(), small.size()) != static_cast<ssize_t>(small.size())) {
      throw std::runtime_error("cannot write the small file");
    }
    ::close(fd);
  }
  for (int r = 0; r < std::max(1, options.rounds / 3); ++r) {
    // A fresh owner each round: nothing of the large file is kept. Its
    // snapshots may hold both files (as `corma serve --snapshot-limit 2G`).
    FileServer server(dir.root, nullptr, "127.0.0.1", 2 * cold_size);
    FileGetter small_getter(server, nullptr);
    FileGetter large_getter(server, nullptr);
    auto alone = small_fetches(small_getter, 200, nullptr);
    m.raw.insert(m.raw.end(), alone.begin(), alone.end());
    drop_from_page_cache(dir.file);
    std::atomic<bool> running{true};
    auto large = std::async(std::launch::async, [&] {
      large_getter.fetch(dir, Path::chunked);
      running = false;
    });
    auto during = small_fetches(small_getter, 0, &running);
    large.get();
    m.corma.insert(m.corma.end(), during.begin(), during.end());
  }
  m.target = "corma p99 <= 5 ms";
  m.target_met = m.corma_p99() <= 5.0;
  return m;
}

}  // namespace corma::bench
