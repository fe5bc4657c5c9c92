// `corma serve` as a separate process while writers change its files as fast
// as they can, every way a writer can: rewritten in place (opened for each
// version, or held open), through a shared mapping, truncated and rewritten
// to another size, and published by rename. Over the chunked path, RDMA
// (whole and in windows) and acquire_many, every fetch that succeeds holds
// exactly one version of its file, and every one that fails says
// object_changed. One file's writer is started anew at every round, while
// the fetches of the round before may still be reading it.
#include "cli/flood.hpp"
#include "support/run.hpp"

#include <corma/consumer.hpp>
#include <corma/ucx.hpp>

#include <fcntl.h>
#include <sys/mman.h>

#include <map>

namespace {

namespace asio = boost::asio;
using namespace corma::cli::testing;
using corma::errc;

constexpr std::size_t MiB = std::size_t{1} << 20;

/// A served file and the versions its writer alternates.
struct StormFile {
  std::string name;
  std::vector<std::vector<char>> versions;
};

/// What the fetches of one file by one path came to.
struct Tally {
  int whole = 0;    ///< succeeded with exactly one version
  int changed = 0;  ///< failed with object_changed
  int mixed = 0;    ///< succeeded with bytes of no single version
  int other = 0;    ///< failed with anything else
  std::string others;
};

class RewriteStorm : public TwoProcesses {
 protected:
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;

  void TearDown() override {
    stop = true;
    for (auto& writer : writers) writer.join();
    TwoProcesses::TearDown();
  }

  /// Writes `bytes` over the file in 64 KiB pieces, all through one open.
  static void write_in_pieces(const fs::path& path, const std::vector<char>& bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY);
    if (fd < 0) return;
    constexpr std::size_t piece = 64 * 1024;
    for (std::size_t at = 0; at < bytes.size(); at += piece) {
      (void)!::pwrite(fd, bytes.data() + at, std::min(piece, bytes.size() - at), static_cast<off_t>(at));
    }
    ::close(fd);
  }

  void write_in_place(const fs::path& path, const std::vector<char>& bytes, int extra_flags) {
    const int fd = ::open(path.c_str(), O_WRONLY | extra_flags);
    if (fd < 0) return;
    (void)!::pwrite(fd, bytes.data(), bytes.size(), 0);
    ::close(fd);
  }

  /// Starts a writer that calls `write(version)` for each version in turn
  /// until the test ends.
  void start_writer(const StormFile& file, std::function<void(const std::vector<char>&)> write) {
    writers.emplace_back([this, &file, write = std::move(write)] {
      for (std::size_t turn = 0; !stop; ++turn) write(file.versions[turn % file.versions.size()]);
    });
  }

  static int which_version(const StormFile& file, std::span<const std::byte> bytes) {
    for (std::size_t v = 0; v < file.versions.size(); ++v) {
      const auto& version = file.versions[v];
      if (version.size() == bytes.size() && std::memcmp(version.data(), bytes.data(), bytes.size()) == 0) {
        return static_cast<int>(v);
      }
    }
    return -1;
  }

  static void count(Tally& tally, const StormFile& file, const corma::Result<void>& outcome,
                    std::span<const std::byte> bytes) {
    if (outcome) {
      (which_version(file, bytes) >= 0 ? tally.whole : tally.mixed) += 1;
    } else if (outcome.error().is(errc::object_changed)) {
      ++tally.changed;
    } else {
      ++tally.other;
      tally.others += outcome.error().message() + "\n";
    }
  }
};

TEST_F(RewriteStorm, EveryFetchIsOneWholeVersionOrObjectChangedWhateverTheWritersDo) {
  const std::vector<char> a = random_bytes(4 * MiB, 1), b = random_bytes(4 * MiB, 2);
  const std::vector<StormFile> files = {
      {"reopened.bin", {a, b}}, {"held-open.bin", {a, b}}, {"mapped.bin", {a, b}},
      {"truncated.bin", {random_bytes(3 * MiB, 3), b}}, {"renamed.bin", {a, b}}, {"restarted.bin", {a, b}}};
  for (const auto& file : files) write_file(root / file.name, file.versions[0]);

  // RDMA whole from one server, in 1 MiB windows from the other.
  auto whole = serve({"--transport", "shm", "--budget", "64M"});
  auto windowed = serve({"--transport", "shm", "--budget", "2M"});
  const asio::ip::tcp::endpoint whole_at(asio::ip::make_address("127.0.0.1"), port_of(whole, "listening on"));
  const asio::ip::tcp::endpoint windowed_at(asio::ip::make_address("127.0.0.1"), port_of(windowed, "listening on"));

  start_writer(files[0], [&](const auto& v) { write_in_place(root / files[0].name, v, 0); });
  const int held = ::open((root / files[1].name).c_str(), O_WRONLY);
  ASSERT_GE(held, 0);
  start_writer(files[1], [&](const auto& v) { (void)!::pwrite(held, v.data(), v.size(), 0); });
  start_writer(files[2], [&](const auto& v) {
    const int fd = ::open((root / files[2].name).c_str(), O_RDWR);
    void* mapping = ::mmap(nullptr, v.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (mapping == MAP_FAILED) return;
    std::memcpy(mapping, v.data(), v.size());
    ::munmap(mapping, v.size());
  });
  start_writer(files[3], [&](const auto& v) { write_in_place(root / files[3].name, v, O_TRUNC); });
  start_writer(files[4], [&](const auto& v) {
    write_file(root / "renamed.tmp", v);
    fs::rename(root / "renamed.tmp", root / files[4].name);
  });

  // The writer of restarted.bin stops after a whole version and starts again
  // at each round: its first open comes while fetches of the file run.
  std::atomic<bool> restart_stop{false};
  std::thread restarted_writer;
  const auto restart_writer = [&] {
    restart_stop = true;
    if (restarted_writer.joinable()) restarted_writer.join();
    restart_stop = false;
    restarted_writer = std::thread([&, file = &files[5]] {
      for (std::size_t turn = 1; !restart_stop && !stop; ++turn) {
        write_in_pieces(root / file->name, file->versions[turn % file->versions.size()]);
      }
    });
  };

  corma::ucx::Config shm;
  shm.transport = corma::ucx::Transport::shared_memory;
  shm.error_handling = corma::ucx::ErrorHandling::none;
  auto registry = std::make_shared<corma::Registry>(corma::ucx::Backend::create(shm).value(),
                                                    corma::RegistryConfig{256 * MiB, 0});
  std::map<std::string, Tally> tallies;  // "path file" -> tally
  asio::io_context io;
  corma::testing::run(
      io,
      [&]() -> asio::awaitable<void> {
        auto chunked = (co_await corma::Consumer::connect(io.get_executor(), whole_at, nullptr)).value();
        auto rdma = (co_await corma::Consumer::connect(io.get_executor(), whole_at, registry)).value();
        auto windows = (co_await corma::Consumer::connect(io.get_executor(), windowed_at, registry)).value();
        auto slots_memory = corma::OwnedBuffer::allocate(files.size() * 4 * MiB);
        auto slots = (co_await registry->async_register(slots_memory.bytes(), corma::Access::local,
                                                        asio::use_awaitable)).value();
        std::vector<std::string> names;
        std::vector<corma::FetchSlot> slot_list;
        for (std::size_t i = 0; i < files.size(); ++i) {
          names.push_back(files[i].name);
          slot_list.push_back({&slots, i * 4 * MiB, 4 * MiB});
        }
        const std::pair<const char*, corma::Consumer*> paths[] = {
            {"chunked", chunked.get()}, {"rdma", rdma.get()}, {"windows", windows.get()}};
        for (int round = 0; round < 12; ++round) {
          // The fetches of the round before may have left reads of
          // restarted.bin under way in the owner: the writer starts anyway.
          restart_writer();
          for (const auto& [path, consumer] : paths) {
            for (const auto& file : files) {
              auto fetched = co_await consumer->async_fetch(file.name);
              std::span<const std::byte> bytes;
              if (fetched) bytes = fetched.value().data.bytes();
              const bool windowed_path = fetched && fetched.value().windows > 0;
              if (fetched && std::string(path) == "windows" && !windowed_path) {
                ADD_FAILURE() << file.name << " was not lent in windows: "
                              << (fetched.value().path == corma::Path::chunked ? "chunked, " : "rdma, ")
                              << fetched.value().reason_text();
              }
              count(tallies[std::string(path) + " " + file.name], file,
                    fetched ? corma::Result<void>(corma::success()) : corma::Result<void>(fetched.error()), bytes);
            }
          }
          auto many = co_await rdma->async_fetch_many(names, slot_list);
          EXPECT_TRUE(many) << many.error().message();
          if (!many) co_return;
          for (std::size_t i = 0; i < files.size(); ++i) {
            const auto& outcome = many.value()[i];
            std::span<const std::byte> bytes;
            if (outcome) bytes = slots.bytes().subspan(i * 4 * MiB, outcome.value().size);
            count(tallies["batch " + files[i].name], files[i],
                  outcome ? corma::Result<void>(corma::success()) : corma::Result<void>(outcome.error()), bytes);
          }
        }
      }(),
      std::chrono::seconds(90));
  stop = true;
  if (restarted_writer.joinable()) restarted_writer.join();
  ::close(held);

  int fetches = 0, whole_versions = 0;
  for (const auto& [what, tally] : tallies) {
    std::printf("[ figure ] %-24s one version %3d, object_changed %3d, mixed %d, other %d\n", what.c_str(), tally.whole,
                tally.changed, tally.mixed, tally.other);
    EXPECT_EQ(tally.mixed, 0) << what << ": a fetch succeeded with a mix of versions";
    EXPECT_EQ(tally.other, 0) << what << ": " << tally.others;
    fetches += tally.whole + tally.changed + tally.mixed + tally.other;
    whole_versions += tally.whole;
  }
  EXPECT_GE(fetches, 200);
  // A file published by rename is never being written: every fetch of it succeeds.
  for (const char* path : {"chunked", "rdma", "windows", "batch"}) {
    const auto& renamed = tallies[std::string(path) + " renamed.bin"];
    EXPECT_EQ(renamed.whole, 12) << path << ": a file published by rename was refused";
  }
  EXPECT_EQ(tallies["rdma held-open.bin"].whole, 0) << "a file held open for writing was served";
}

}  // namespace
