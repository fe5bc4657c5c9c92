#include "file_fetch.hpp"

#include "bench_support.hpp"
#include "file_server.hpp"
#include "file_resolver.hpp"
#include "output_file.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include <corma/ucx.hpp>

#include <fcntl.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t file_size = 256 * MiB;

/// Seconds to stream the file (open as `fd`) over loopback TCP into the
/// output file. The file is opened once for every round, not per stream:
/// an open of the served file is what corma serve's cache watches for (a
/// writer's first step), and would drop the snapshot the corma rounds are
/// meant to find warm.
double tcp_stream_seconds(const ServedDirectory& dir, int fd) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  std::thread sender([&] {
    auto socket = acceptor.accept();
    off_t offset = 0;
    while (offset < static_cast<off_t>(file_size)) {
      if (::sendfile(socket.native_handle(), fd, &offset, file_size - static_cast<std::size_t>(offset)) <= 0) break;
    }
  });
  const auto start = clock_type::now();
  asio::ip::tcp::socket receiver(io);
  receiver.connect(acceptor.local_endpoint());
  const int out = ::open(dir.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  std::vector<std::byte> buffer(MiB);
  std::size_t received = 0;
  for (;;) {
    boost::system::error_code ec;
    const auto got = receiver.read_some(asio::buffer(buffer), ec);
    if (ec) break;
    if (::write(out, buffer.data(), got) != static_cast<ssize_t>(got)) throw std::runtime_error("write failed");
    received += got;
  }
  ::close(out);
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  sender.join();
  if (received != file_size) throw std::runtime_error("the TCP stream lost bytes");
  return seconds;
}

/// A UCX registry over shared memory with a budget of `budget` bytes.
std::shared_ptr<Registry> shm_registry(std::uint64_t budget) {
  return std::make_shared<Registry>(must(ucx::Backend::create(corma_config("shm")), "backend"),
                                    RegistryConfig{budget, 0});
}

}  // namespace

Measurement file_fetch_chunked(const Options& options) {
  Measurement m{"file_fetch", "tcp", "size=" + size_name(file_size) + " chunked", "GB/s", true, {}, {}, {}, true};
  ServedDirectory dir(file_size);
  FileServer server(dir.root, nullptr);
  FileGetter getter(server, nullptr);
  const int served = ::open(dir.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (served < 0) throw std::runtime_error("cannot open the served file");
  (void)getter.fetch(dir, Path::chunked);  // warm: the version's snapshot stays cached
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(file_size) / getter.fetch(dir, Path::chunked) / 1e9);
    m.raw.push_back(static_cast<double>(file_size) / tcp_stream_seconds(dir, served) / 1e9);
  }
  ::close(served);
  m.target = "ratio >= 0.90";
  m.target_met = m.ratio() >= 0.90;
  return m;
}

Measurement file_fetch_windows(const Options& options) {
  constexpr std::uint64_t small_budget = 64 * MiB;
  Measurement m{"file_fetch", "shm", "size=" + size_name(file_size) + " rdma budget=" + size_name(small_budget),
                "GB/s", true, {}, {}, {}, true};
  ServedDirectory dir(file_size);
  FileServer windowed(dir.root, shm_registry(small_budget));
  FileServer whole(dir.root, shm_registry(4 * file_size));
  FileGetter from_windowed(windowed, shm_registry(4 * file_size));
  FileGetter from_whole(whole, shm_registry(4 * file_size));
  (void)from_windowed.fetch(dir, Path::rdma);  // warm: page cache, snapshots
  (void)from_whole.fetch(dir, Path::rdma);
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(file_size) / from_windowed.fetch(dir, Path::rdma) / 1e9);
    m.raw.push_back(static_cast<double>(file_size) / from_whole.fetch(dir, Path::rdma) / 1e9);
  }
  if (windowed.owner.stats().windows < 4 * static_cast<std::uint64_t>(options.rounds)) {
    throw std::runtime_error("the small budget's fetches did not go in windows");
  }
  m.target = "ratio >= 0.80 (against a budget that holds the file)";
  m.target_met = m.ratio() >= 0.80;
  return m;
}

}  // namespace corma::bench
