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
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

namespace corma::bench {

namespace asio = boost::asio;

namespace {

constexpr std::size_t file_size = 256 * MiB;

/// A directory with one file of `size` bytes, gone with the object.
struct ServedDirectory {
  std::filesystem::path root;
  std::filesystem::path file;
  std::filesystem::path output;

  explicit ServedDirectory(std::size_t size) {
    std::string pattern = (std::filesystem::temp_directory_path() / "corma-bench-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    root = pattern;
    file = root / "served.bin";
    output = root / "fetched.bin";
    std::vector<std::byte> block(MiB);
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::byte>(i * 31 + 7);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot create the served file");
    for (std::size_t at = 0; at < size; at += block.size()) {
      if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) {
        throw std::runtime_error("cannot write the served file");
      }
    }
    ::close(fd);
  }
  ~ServedDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }
  ServedDirectory(const ServedDirectory&) = delete;
  ServedDirectory& operator=(const ServedDirectory&) = delete;
};

/// Seconds to stream the file over loopback TCP into the output file.
double tcp_stream_seconds(const ServedDirectory& dir) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  std::thread sender([&] {
    auto socket = acceptor.accept();
    const int fd = ::open(dir.file.c_str(), O_RDONLY | O_CLOEXEC);
    off_t offset = 0;
    while (offset < static_cast<off_t>(file_size)) {
      if (::sendfile(socket.native_handle(), fd, &offset, file_size - static_cast<std::size_t>(offset)) <= 0) break;
    }
    ::close(fd);
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

/// `corma get` in this process: a consumer of `server` on a thread of its
/// own (the caller waits on futures), writing fetched files as they come.
struct FileGetter {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread{[this] { io.run(); }};
  std::unique_ptr<Consumer> consumer;

  FileGetter(const FileServer& server, std::shared_ptr<Registry> registry) {
    consumer = must(Consumer::connect(io.get_executor(), server.acceptor.local_endpoint(), std::move(registry), {},
                                      asio::use_future)
                        .get(),
                    "consumer");
  }
  FileGetter(const FileGetter&) = delete;
  FileGetter& operator=(const FileGetter&) = delete;
  ~FileGetter() {
    asio::post(io, [this] { consumer.reset(); });
    work.reset();
    thread.join();
  }

  /// Fetches the served file into the output file; seconds taken.
  double fetch(const ServedDirectory& dir, Path expected) {
    const auto start = clock_type::now();
    auto output = must(cli::OutputFile::create(dir.output), "output file");
    auto fetched = must(
        consumer->async_fetch_to(dir.file.filename().string(), output.destination(), asio::use_future).get(),
        "fetch");
    if (fetched.path != expected || fetched.size != file_size) throw std::runtime_error("wrong fetch");
    must(output.keep(), "output file");
    return std::chrono::duration<double>(clock_type::now() - start).count();
  }
};

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
  (void)getter.fetch(dir, Path::chunked);  // warm: the version's snapshot stays cached
  for (int r = 0; r < options.rounds; ++r) {
    m.corma.push_back(static_cast<double>(file_size) / getter.fetch(dir, Path::chunked) / 1e9);
    m.raw.push_back(static_cast<double>(file_size) / tcp_stream_seconds(dir) / 1e9);
  }
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
