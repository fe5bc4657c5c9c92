// `corma serve` in the benchmark's own process.
#pragma once

#include "bench_support.hpp"
#include "file_resolver.hpp"

#include <corma/owner.hpp>

#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <filesystem>
#include <memory>
#include <thread>

namespace corma::bench {

/// An owner serving `root` through corma serve's file resolver on a thread
/// of its own, with `registry` (null: chunks only).
struct FileServer {
  boost::asio::io_context io{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work = boost::asio::make_work_guard(io);
  Owner owner;
  boost::asio::ip::tcp::acceptor acceptor{io, {boost::asio::ip::make_address("127.0.0.1"), 0}};
  std::thread thread;

  FileServer(const std::filesystem::path& root, std::shared_ptr<Registry> registry)
      : owner(io.get_executor(), std::move(registry), OwnerConfig{}) {
    const auto files = must(cli::FileResolver::create(root), "file resolver");
    owner.set_resolver(files, [files] { files.refresh(); });
    owner.serve(acceptor, boost::asio::detached);
    thread = std::thread([this] { io.run(); });
  }
  FileServer(const FileServer&) = delete;
  FileServer& operator=(const FileServer&) = delete;
  ~FileServer() {
    stop_serving(io, owner, acceptor);
    work.reset();
    thread.join();
  }
};

}  // namespace corma::bench
