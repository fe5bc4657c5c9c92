// What the directory rows share: a private etcd, and waiting on a future
// while the row's io_context runs.
#pragma once

#include "support/etcd_process.hpp"

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <stdexcept>

namespace corma::bench {

/// A private etcd, started; nullptr (said on stderr for `row`) when this
/// machine has none.
inline std::unique_ptr<testing::EtcdProcess> start_private_etcd(const char* row) {
  if (auto missing = testing::EtcdProcess::missing()) {
    std::fprintf(stderr, "  %s: skipped: %s\n", row, missing->c_str());
    return nullptr;
  }
  auto etcd = std::make_unique<testing::EtcdProcess>();
  if (!etcd->start()) throw std::runtime_error("etcd did not start: " + etcd->output());
  return etcd;
}

/// Runs `io` until `done` is ready, and gives its value.
template <class Future>
auto run_until_ready(boost::asio::io_context& io, Future done) {
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) io.run_one();
  return done.get();
}

}  // namespace corma::bench
