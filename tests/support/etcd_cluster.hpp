// A private etcd cluster of three members on loopback ports, for the tests
// where one member dies under load.
#pragma once

#include "support/etcd_process.hpp"

#include <corma/directory.hpp>

#include <array>
#include <memory>
#include <string>

namespace corma::testing {

class EtcdCluster {
 public:
  static constexpr std::size_t size = 3;

  EtcdCluster() {
    std::array<std::uint16_t, size> peer_ports{};
    std::string initial_cluster;
    for (std::size_t i = 0; i < size; ++i) {
      client_ports_[i] = EtcdProcess::free_port();
      peer_ports[i] = EtcdProcess::free_port();
      initial_cluster += (i == 0 ? "" : ",") + name(i) + "=http://127.0.0.1:" + std::to_string(peer_ports[i]);
    }
    for (std::size_t i = 0; i < size; ++i) {
      members_[i] = std::make_unique<EtcdProcess>();
      members_[i]->as_member(name(i), client_ports_[i], peer_ports[i], initial_cluster);
    }
  }

  /// Starts every member and waits until each serves clients.
  bool start() {
    for (auto& member : members_) member->launch();
    for (auto& member : members_) {
      if (!member->wait_ready()) return false;
    }
    return true;
  }

  /// Kills member `i` as a crash would.
  void kill(std::size_t i) { members_[i]->stop(); }

  /// A directory config naming every member, member `first` first.
  [[nodiscard]] DirectoryConfig config(std::string key_prefix, std::size_t first = 0) const {
    DirectoryConfig config;
    config.port = client_ports_[first];
    for (std::size_t i = 1; i < size; ++i) config.other_members.push_back({"127.0.0.1", client_ports_[(first + i) % size]});
    config.key_prefix = std::move(key_prefix);
    return config;
  }

  /// What every member said.
  [[nodiscard]] std::string output() const {
    std::string all;
    for (std::size_t i = 0; i < size; ++i) all += "--- " + name(i) + ":\n" + members_[i]->output();
    return all;
  }

 private:
  static std::string name(std::size_t i) { return "member-" + std::to_string(i); }

  std::array<std::uint16_t, size> client_ports_{};
  std::array<std::unique_ptr<EtcdProcess>, size> members_;
};

}  // namespace corma::testing
