// `corma serve` and `corma get` in the benchmark's own process, and the
// served directory they share.
#pragma once

#include "bench_support.hpp"
#include "file_resolver.hpp"
#include "output_file.hpp"

#include <corma/consumer.hpp>
#include <corma/owner.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_future.hpp>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace corma::bench {

/// An owner serving `root` through corma serve's file resolver on a thread
/// of its own, with `registry` (null: chunks only), listening on `address`.
struct FileServer {
  boost::asio::io_context io{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work = boost::asio::make_work_guard(io);
  /// corma serve's file threads: files are read into snapshots off the loop.
  boost::asio::thread_pool file_readers{2};
  Owner owner;
  boost::asio::ip::tcp::acceptor acceptor;
  std::thread thread;

  FileServer(const std::filesystem::path& root, std::shared_ptr<Registry> registry,
             const std::string& address = "127.0.0.1",
             std::uint64_t snapshot_limit = cli::FileResolver::default_snapshot_limit)
      : owner(io.get_executor(), std::move(registry), OwnerConfig{}),
        acceptor(io, {boost::asio::ip::make_address(address), 0}) {
    const auto files = must(cli::FileResolver::create(root, snapshot_limit), "file resolver");
    owner.set_resolver(
        [files, readers = file_readers.get_executor()](std::string name, ResolveHandler done) {
          files.resolve(std::move(name), readers, std::move(done));
        },
        [files] { files.refresh(); });
    owner.serve(acceptor, boost::asio::detached);
    thread = std::thread([this] { io.run(); });
  }
  FileServer(const FileServer&) = delete;
  FileServer& operator=(const FileServer&) = delete;
  ~FileServer() {
    stop_serving(io, owner, acceptor);
    work.reset();
    thread.join();
    file_readers.join();
  }
};

/// A directory with one file of `size` bytes, gone with the object.
struct ServedDirectory {
  std::size_t size;
  std::filesystem::path root;
  std::filesystem::path file;
  std::filesystem::path output;

  explicit ServedDirectory(std::size_t bytes) : size(bytes) {
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

/// `corma get` in this process: a consumer of `server` on a thread of its
/// own (the caller waits on futures), writing fetched files as they come.
struct FileGetter {
  boost::asio::io_context io{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work = boost::asio::make_work_guard(io);
  std::thread thread{[this] { io.run(); }};
  /// Writes the output's chunks, as corma get's file thread does.
  boost::asio::thread_pool file_writer{1};
  std::unique_ptr<Consumer> consumer;

  FileGetter(const FileServer& server, std::shared_ptr<Registry> registry) {
    consumer = must(Consumer::connect(io.get_executor(), server.acceptor.local_endpoint(), std::move(registry), {},
                                      boost::asio::use_future)
                        .get(),
                    "consumer");
  }
  FileGetter(const FileGetter&) = delete;
  FileGetter& operator=(const FileGetter&) = delete;
  ~FileGetter() {
    boost::asio::post(io, [this] { consumer.reset(); });
    work.reset();
    thread.join();
  }

  /// Fetches the served file into the output file; seconds taken.
  double fetch(const ServedDirectory& dir, Path expected) {
    const auto start = clock_type::now();
    auto output = must(cli::OutputFile::create(dir.output), "output file");
    auto fetched = must(
        consumer->async_fetch_to(dir.file.filename().string(), output.destination(file_writer.get_executor()),
                                 boost::asio::use_future)
            .get(),
        "fetch");
    if (fetched.path != expected || fetched.size != dir.size) throw std::runtime_error("wrong fetch");
    must(output.keep(), "output file");
    return std::chrono::duration<double>(clock_type::now() - start).count();
  }
};

}  // namespace corma::bench
