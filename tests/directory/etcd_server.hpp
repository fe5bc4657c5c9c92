// A real etcd for a test (support/etcd_process.hpp), reporting a failed
// start as a test failure, with what etcd said.
#pragma once

#include "support/etcd_process.hpp"

#include <corma/directory.hpp>

#include <gtest/gtest.h>

#include <string>

namespace corma::testing {

class EtcdServer {
 public:
  static std::optional<std::string> missing() { return EtcdProcess::missing(); }

  bool start() {
    if (etcd_.start()) return true;
    ADD_FAILURE() << "etcd said:\n" << etcd_.output();
    return false;
  }
  void stop() { etcd_.stop(); }

  [[nodiscard]] DirectoryConfig config(std::string key_prefix) const {
    DirectoryConfig config;
    config.port = etcd_.client_port();
    config.key_prefix = std::move(key_prefix);
    return config;
  }

 private:
  EtcdProcess etcd_;
};

}  // namespace corma::testing
