// scan_files: what corma serve --announce-files names and versions.
#include "announced_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace {

namespace fs = std::filesystem;
using corma::errc;

class ScanFiles : public ::testing::Test {
 protected:
  fs::path root = fs::temp_directory_path() / ("corma-scan-" + std::to_string(::getpid()));

  void SetUp() override {
    fs::remove_all(root);
    fs::create_directories(root / "sub" / "deeper");
  }
  void TearDown() override { fs::remove_all(root); }

  void file(const fs::path& relative, std::uint64_t version) {
    std::ofstream(root / relative) << "bytes";
    const timespec times[2] = {{0, 0}, {static_cast<time_t>(version / 1'000'000'000u),
                                        static_cast<long>(version % 1'000'000'000u)}};
    ASSERT_EQ(::utimensat(AT_FDCWD, (root / relative).c_str(), times, 0), 0);
  }
};

TEST_F(ScanFiles, EveryRegularFileByItsRelativeNameWithItsModificationTimeInNanoseconds) {
  file("top.bin", 1'000'000'000'123u);
  file("sub/deeper/leaf.bin", 2'000'000'000'456u);
  // Links are not followed (not even to a file inside the root), and
  // directories are not files.
  fs::create_symlink(root / "top.bin", root / "sub" / "link.bin");
  fs::create_directory_symlink("/etc", root / "etc-link");
  auto scanned = corma::cli::scan_files(root, 10);
  ASSERT_TRUE(scanned) << scanned.error().message();
  const corma::cli::FileVersions expected{{"sub/deeper/leaf.bin", 2'000'000'000'456u}, {"top.bin", 1'000'000'000'123u}};
  EXPECT_EQ(scanned.value(), expected);
}

TEST_F(ScanFiles, MoreFilesThanAllowedIsRefusedAndAMissingRootSaysSo) {
  for (int i = 0; i < 4; ++i) file("f" + std::to_string(i), 1);
  auto too_many = corma::cli::scan_files(root, 3);
  ASSERT_FALSE(too_many);
  EXPECT_TRUE(too_many.error().is(errc::out_of_range)) << too_many.error().message();
  EXPECT_TRUE(corma::cli::scan_files(root, 4));
  auto missing = corma::cli::scan_files(root / "none", 4);
  ASSERT_FALSE(missing);
  EXPECT_TRUE(missing.error().is(errc::not_configured)) << missing.error().message();
}

}  // namespace
