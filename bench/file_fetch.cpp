#include "file_fetch.hpp"

#include "bench_support.hpp"
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

}  // namespace

Measurement file_fetch_chunked(const Options& options) {
  Measurement m{"file_fetch", "tcp", "size=" + size_name(file_size) + " chunked", "GB/s", true, {}, {}, {}, true};
  ServedDirectory dir(file_size);
  auto resolver = must(cli::FileResolver::create(dir.root), "file resolver");

  asio::io_context owner_io(1);
  auto owner_work = asio::make_work_guard(owner_io);
  Owner owner(owner_io.get_executor(), nullptr, OwnerConfig{});
  owner.set_resolver(resolver);
  asio::ip::tcp::acceptor acceptor(owner_io, {asio::ip::make_address("127.0.0.1"), 0});
  owner.serve(acceptor, asio::detached);
  std::thread owner_thread([&] { owner_io.run(); });

  // The consumer runs on a thread of its own; this thread waits on futures.
  asio::io_context consumer_io(1);
  auto consumer_work = asio::make_work_guard(consumer_io);
  std::thread consumer_thread([&] { consumer_io.run(); });
  auto consumer = must(Consumer::connect(consumer_io.get_executor(), acceptor.local_endpoint(), nullptr, {},
                                         asio::use_future)
                           .get(),
                       "consumer");
  // As corma get does: the chunks are written to the file as they come.
  auto fetch_to_file = [&] {
    auto output = must(cli::OutputFile::create(dir.output), "output file");
    auto fetched =
        must(consumer->async_fetch_to(dir.file.filename().string(), output.sink(), asio::use_future).get(), "fetch");
    if (fetched.path != Path::chunked || fetched.size != file_size) throw std::runtime_error("wrong fetch");
    must(output.keep(), "output file");
  };
  fetch_to_file();  // warm: the version's snapshot stays cached

  for (int r = 0; r < options.rounds; ++r) {
    const auto start = clock_type::now();
    fetch_to_file();
    const double corma_seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    m.corma.push_back(static_cast<double>(file_size) / corma_seconds / 1e9);
    m.raw.push_back(static_cast<double>(file_size) / tcp_stream_seconds(dir) / 1e9);
  }
  m.target = "ratio >= 0.90";
  m.target_met = m.ratio() >= 0.90;

  // Each side is torn down on its own thread.
  asio::post(consumer_io, [&] { consumer.reset(); });
  stop_serving(owner_io, owner, acceptor);
  owner_work.reset();
  consumer_work.reset();
  consumer_thread.join();
  owner_thread.join();
  return m;
}

}  // namespace corma::bench
