// Test owners for the cluster tests: an in-process Owner announced in a
// real etcd, and the fixture that starts that etcd.
#pragma once

#include "directory/etcd_server.hpp"
#include "support/run.hpp"

#include <corma/directory.hpp>
#include <corma/owner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <optional>
#include <span>
#include <string>
#include <vector>

namespace corma::testing {

namespace asio = boost::asio;

/// An owner serving `bytes` as "obj" and, sliced, as "part-<i>" (chunks
/// only), announced as `id` (with `obj_version` as the version of "obj").
struct AnnouncedOwner {
  static constexpr std::size_t parts = 40;
  static constexpr std::size_t part_size = 4096;

  AnnouncedOwner(asio::io_context& io, const corma::DirectoryConfig& config, std::string id, std::uint64_t load,
                 const std::vector<std::byte>& bytes, corma::OwnerConfig owner_config = {},
                 std::chrono::seconds ttl = std::chrono::seconds(5),
                 std::optional<std::uint64_t> obj_version = std::nullopt)
      : acceptor(io, {asio::ip::make_address("127.0.0.1"), 0}),
        owner(io.get_executor(), nullptr, owner_config),
        directory(io.get_executor(), config) {
    owner.publish("obj", corma::PublishedObject{bytes, nullptr});
    corma::Announcement a;
    a.names = {"obj"};
    for (std::size_t i = 0; i < parts; ++i) {
      owner.publish("part-" + std::to_string(i),
                    corma::PublishedObject{std::span(bytes).subspan(i * part_size, part_size), nullptr});
      a.names.push_back("part-" + std::to_string(i));
    }
    asio::co_spawn(io, owner.serve(acceptor), asio::detached);
    a.owner = corma::OwnerEntry{std::move(id), "127.0.0.1", acceptor.local_endpoint().port(), "host", "none", 3, load};
    a.ttl = ttl;
    if (obj_version) a.versions["obj"] = *obj_version;
    announced = corma::testing::run(io, directory.async_announce(std::move(a)));
  }
  void kill() {
    owner.stop();
    acceptor.close();
  }

  asio::ip::tcp::acceptor acceptor;
  corma::Owner owner;
  corma::Directory directory;
  corma::Result<void> announced = corma::success();
};

/// A real etcd and the bytes every owner serves.
class ClusterTest : public ::testing::Test {
 protected:
  asio::io_context io;
  corma::testing::EtcdServer etcd;
  std::vector<std::byte> bytes = std::vector<std::byte>(300 * 1024);

  void SetUp() override {
    if (auto missing = corma::testing::EtcdServer::missing()) GTEST_SKIP() << *missing;
    ASSERT_TRUE(etcd.start()) << "etcd did not start";
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 13 + 1);
  }

  corma::DirectoryConfig config() {
    auto c = etcd.config("/cluster");
    c.machine = "consumer-host";
    c.cache_ttl = std::chrono::milliseconds(0);
    return c;
  }
};

}  // namespace corma::testing
