// The snapshot cache behind corma serve: one snapshot per file version,
// kept for the next fetch once nobody reads it, replaced by a newer version,
// and evicted (least recently used, never while read) when another file
// needs the room.
#include "file_snapshot.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace corma::cli {
namespace {

class SnapshotCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/corma-snapshots-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::string write_file(const std::string& name, std::size_t size, char fill) {
    const auto path = dir / name;
    std::ofstream(path, std::ios::binary) << std::string(size, fill);
    return path.string();
  }

  /// The snapshot of `path`, opened and closed around the call.
  Result<std::shared_ptr<const FileSnapshot>> snapshot(SnapshotCache& cache, const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(errc::region_not_found, "cannot open " + path);
    auto taken = cache.snapshot(fd, path, path);
    ::close(fd);
    return taken;
  }

  std::filesystem::path dir;
};

TEST_F(SnapshotCacheTest, AnUnchangedFileIsReadOnceAndKeptWhileNobodyReadsIt) {
  SnapshotCache cache(1 << 20);
  const auto path = write_file("a", 4096, 'a');
  const FileSnapshot* first = nullptr;
  {
    auto taken = snapshot(cache, path);
    ASSERT_TRUE(taken) << taken.error().message();
    first = taken.value().get();
  }  // nobody reads it now
  EXPECT_EQ(cache.bytes_held(), 4096u) << "the idle snapshot was not kept";
  auto again = snapshot(cache, path);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again.value().get(), first) << "an unchanged file was read again";
  EXPECT_EQ(again.value()->bytes()[0], std::byte{'a'});
}

TEST_F(SnapshotCacheTest, ANewVersionGetsANewSnapshotWhileTheOldOneKeepsItsBytes) {
  SnapshotCache cache(1 << 20);
  const auto path = write_file("a", 4096, 'a');
  auto old_version = snapshot(cache, path);
  ASSERT_TRUE(old_version);
  write_file("a", 2048, 'b');
  auto new_version = snapshot(cache, path);
  ASSERT_TRUE(new_version) << new_version.error().message();
  EXPECT_NE(new_version.value().get(), old_version.value().get());
  EXPECT_EQ(new_version.value()->bytes().size(), 2048u);
  EXPECT_EQ(new_version.value()->bytes()[0], std::byte{'b'});
  EXPECT_EQ(old_version.value()->bytes().size(), 4096u);
  EXPECT_EQ(old_version.value()->bytes()[0], std::byte{'a'});
  old_version = fail(errc::cancelled, "dropped");  // the old version's last reader is done
  EXPECT_EQ(cache.bytes_held(), 2048u) << "the replaced version was kept";
}

TEST_F(SnapshotCacheTest, IdleSnapshotsMakeRoomLeastRecentlyUsedFirstButNeverOneBeingRead) {
  SnapshotCache cache(10000);
  const auto a = write_file("a", 4000, 'a');
  const auto b = write_file("b", 4000, 'b');
  const auto c = write_file("c", 4000, 'c');
  ASSERT_TRUE(snapshot(cache, a));
  ASSERT_TRUE(snapshot(cache, b));
  ASSERT_TRUE(snapshot(cache, a));  // a is now the more recently used
  auto read_c = snapshot(cache, c);  // 12000 > 10000: b (idle, older) goes
  ASSERT_TRUE(read_c) << read_c.error().message();
  EXPECT_EQ(cache.bytes_held(), 8000u);

  auto read_a = snapshot(cache, a);  // cached: no room needed
  ASSERT_TRUE(read_a);
  // a and c are both being read: b cannot come back.
  auto refused = snapshot(cache, b);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::budget_exceeded)) << refused.error().message();
  EXPECT_EQ(read_a.value()->bytes()[0], std::byte{'a'});
  EXPECT_EQ(read_c.value()->bytes()[0], std::byte{'c'});
}

}  // namespace
}  // namespace corma::cli
