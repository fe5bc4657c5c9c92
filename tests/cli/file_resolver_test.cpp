// The files behind corma serve: each served version read whole under a read
// lease (never a mix, whatever a writer does), kept for the next fetch only
// while nothing can have changed it or its name, within a byte limit; and
// names that are not plain relative paths refused before the file system
// sees them.
#include "file_resolver.hpp"

#include <gtest/gtest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <condition_variable>
#include <cstdlib>
#include <optional>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace corma::cli {
namespace {

namespace fs = std::filesystem;

class FileResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/corma-files-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir = pattern;
  }
  void TearDown() override { fs::remove_all(dir); }

  void write_file(const std::string& name, std::size_t size, char fill) {
    std::ofstream(dir / name, std::ios::binary) << std::string(size, fill);
  }

  /// The snapshot behind `name` as a fresh request sees it.
  static Result<PublishedObject> fetch(const FileResolver& resolver, std::string_view name) {
    resolver.refresh();
    return resolver(name);
  }

  static char first_byte(const PublishedObject& object) { return static_cast<char>(object.bytes[0]); }

  fs::path dir;
};

TEST_F(FileResolverTest, AReadNobodyWantsAnyMoreIsNotMadeAndAReadOthersWantGoesOn) {
  // Three look-ups of one cold file share one read, queued behind a busy
  // file thread. One is given up: the read is still made for the other two.
  // Then both of those are given up too: the read is not made at all, and
  // nothing is held or kept.
  constexpr std::size_t size = 1 << 20;
  write_file("cold", size, 'c');
  write_file("other", size, 'o');
  auto resolver = FileResolver::create(dir, 8 * size).value();
  boost::asio::thread_pool readers(1);
  boost::asio::io_context asking;  // where the look-ups are answered and given up
  std::latch busy(1);
  boost::asio::post(readers, [&] { busy.wait(); });

  struct Asker {
    boost::asio::cancellation_signal give_up;
    std::optional<Result<PublishedObject>> found;
  };
  std::array<Asker, 3> cold;
  Asker other;
  const auto ask = [&](const std::string& name, Asker& asker) {
    resolver.resolve(name, readers.get_executor(),
                     boost::asio::bind_cancellation_slot(
                         asker.give_up.slot(), boost::asio::bind_executor(asking, [&asker](Result<PublishedObject> r) {
                           asker.found.emplace(std::move(r));
                         })));
  };
  resolver.refresh();
  for (auto& asker : cold) ask("cold", asker);
  ask("other", other);
  const auto run_until = [&](const auto& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      asking.restart();
      asking.run_one_for(std::chrono::milliseconds(10));
    }
    return done();
  };

  // Given up while the read waits for its thread: answered at once.
  cold[0].give_up.emit(boost::asio::cancellation_type::terminal);
  other.give_up.emit(boost::asio::cancellation_type::terminal);
  ASSERT_TRUE(run_until([&] { return cold[0].found && other.found; })) << "a look-up given up was not answered";
  EXPECT_FALSE(cold[0].found->has_value());
  EXPECT_TRUE(cold[0].found->error().is(errc::cancelled)) << cold[0].found->error().message();
  EXPECT_TRUE(other.found->error().is(errc::cancelled));
  busy.count_down();
  ASSERT_TRUE(run_until([&] { return cold[1].found && cold[2].found; }));
  for (auto* asker : {&cold[1], &cold[2]}) {
    ASSERT_TRUE(*asker->found) << asker->found->error().message();
    EXPECT_EQ(asker->found->value().bytes.size(), size);
  }
  EXPECT_EQ(resolver.snapshot_bytes(), size) << "the read nobody wanted was made";
  readers.join();
  for (auto& asker : cold) asker.found.reset();
  // The file read nobody wanted is not kept: the next look-up reads it.
  auto later = fetch(resolver, "other");
  ASSERT_TRUE(later) << later.error().message();
  EXPECT_EQ(first_byte(later.value()), 'o');
}

TEST_F(FileResolverTest, AnUnchangedFileIsReadOnceAndKeptWhileNobodyReadsIt) {
  write_file("a", 4096, 'a');
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  const void* first = nullptr;
  std::weak_ptr<const void> first_version;
  {
    auto taken = fetch(resolver, "a");
    ASSERT_TRUE(taken) << taken.error().message();
    first = taken.value().keepalive.get();
    first_version = taken.value().version;
  }  // nobody reads it now
  EXPECT_EQ(resolver.snapshot_bytes(), 4096u) << "the idle snapshot was not kept";
  auto again = fetch(resolver, "a");
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again.value().keepalive.get(), first) << "an unchanged file was read again";
  EXPECT_EQ(first_byte(again.value()), 'a');
  // Lent under a fresh keepalive, but named as the same version: an owner
  // tells every fetch of it the same generation.
  ASSERT_TRUE(again.value().version);
  EXPECT_FALSE(first_version.expired());
  EXPECT_TRUE(!first_version.owner_before(again.value().version) && !again.value().version.owner_before(first_version))
      << "two lendings of one snapshot named different versions";

  write_file("a", 4096, 'b');
  auto changed = fetch(resolver, "a");
  ASSERT_TRUE(changed) << changed.error().message();
  EXPECT_EQ(first_byte(changed.value()), 'b');
  EXPECT_TRUE(first_version.owner_before(changed.value().version) || changed.value().version.owner_before(first_version))
      << "a changed file named the old version";
}

TEST_F(FileResolverTest, ConsumersAskingForOneColdFileAtOnceShareOneRead) {
  // Eight look-ups of one file, as the owner's loop makes them for eight
  // consumers at once, with a limit that holds the file once but not twice:
  // one read serves them all.
  constexpr std::size_t size = 8 << 20;
  write_file("cold", size, 'c');
  auto resolver = FileResolver::create(dir, size + size / 2).value();
  boost::asio::thread_pool readers(2);
  constexpr int askers = 8;
  std::mutex mutex;
  std::vector<Result<PublishedObject>> found;
  std::latch answered(askers);
  resolver.refresh();
  for (int i = 0; i < askers; ++i) {
    resolver.resolve("cold", readers.get_executor(), [&](Result<PublishedObject> result) {
      {
        std::lock_guard lock(mutex);
        found.push_back(std::move(result));
      }
      answered.count_down();
    });
  }
  answered.wait();
  ASSERT_EQ(found.size(), static_cast<std::size_t>(askers));
  for (const auto& result : found) {
    ASSERT_TRUE(result) << result.error().message();
    EXPECT_EQ(result.value().keepalive, found.front().value().keepalive) << "the file was read more than once";
    EXPECT_EQ(result.value().bytes.size(), size);
  }
  EXPECT_EQ(resolver.snapshot_bytes(), size);
  readers.join();
}

TEST_F(FileResolverTest, AFileRenamedOverTheNameWhileItsOldVersionIsReadIsNotHiddenByTheOldSnapshot) {
  // The new version arrives while the old one is being read: the change is
  // seen (and the name's watch given up) before the read ends. The read's
  // snapshot serves its own fetch, but must not be kept for the next.
  constexpr std::size_t size = 64u << 20;
  write_file("big", size, 'o');
  write_file("big.new", size, 'n');
  auto resolver = FileResolver::create(dir, 1u << 30).value();
  resolver.refresh();
  Result<PublishedObject> old_read = fail(errc::backend, "not read");
  std::thread reader([&] { old_read = resolver("big"); });
  // The snapshot's memory is counted once the lease is held and the read begins.
  while (resolver.snapshot_bytes() == 0) std::this_thread::yield();
  fs::rename(dir / "big.new", dir / "big");
  resolver.refresh();
  reader.join();
  ASSERT_TRUE(old_read) << old_read.error().message();
  EXPECT_EQ(first_byte(old_read.value()), 'o');
  old_read = fail(errc::backend, "let go");
  auto next = fetch(resolver, "big");
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(first_byte(next.value()), 'n') << "the old version's snapshot was kept past the rename";
}

TEST_F(FileResolverTest, AWriteInPlaceWithinTheSameClockTickIsSeenByTheNextRequest) {
  write_file("a", 4096, 'a');
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  auto old_version = fetch(resolver, "a");
  ASSERT_TRUE(old_version);
  // Same size, written at once: the file's times may not move at all.
  const int fd = ::open((dir / "a").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const std::string b(4096, 'b');
  ASSERT_EQ(::pwrite(fd, b.data(), b.size(), 0), 4096);
  ::close(fd);
  auto new_version = fetch(resolver, "a");
  ASSERT_TRUE(new_version) << new_version.error().message();
  EXPECT_NE(new_version.value().keepalive.get(), old_version.value().keepalive.get());
  EXPECT_EQ(first_byte(new_version.value()), 'b');
  EXPECT_EQ(first_byte(old_version.value()), 'a') << "a snapshot being read changed";
  old_version = fail(errc::cancelled, "dropped");  // the old version's last reader is done
  EXPECT_EQ(resolver.snapshot_bytes(), 4096u) << "the replaced version was kept";
}

TEST_F(FileResolverTest, AFileRenamedOverTheNameIsTheNewVersion) {
  fs::create_directories(dir / "d");
  write_file("d/a", 100, 'a');
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  ASSERT_EQ(first_byte(fetch(resolver, "d/a").value()), 'a');
  write_file("d/a.tmp", 200, 'b');
  fs::rename(dir / "d/a.tmp", dir / "d/a");
  auto renamed = fetch(resolver, "d/a");
  ASSERT_TRUE(renamed) << renamed.error().message();
  EXPECT_EQ(renamed.value().bytes.size(), 200u);
  EXPECT_EQ(first_byte(renamed.value()), 'b');

  // A directory on the way renamed, and another put in its place.
  fs::rename(dir / "d", dir / "old");
  fs::create_directories(dir / "d");
  write_file("d/a", 300, 'c');
  auto replaced = fetch(resolver, "d/a");
  ASSERT_TRUE(replaced) << replaced.error().message();
  EXPECT_EQ(first_byte(replaced.value()), 'c');
}

TEST_F(FileResolverTest, AFileHeldOpenForWritingIsRefusedAsChangingAndServedOnceClosed) {
  write_file("a", 4096, 'a');
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  const int writer = ::open((dir / "a").c_str(), O_WRONLY);
  ASSERT_GE(writer, 0);
  auto refused = fetch(resolver, "a");
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::object_changed)) << refused.error().message();
  EXPECT_NE(refused.error().detail.find("renaming"), std::string::npos) << "no advice: " << refused.error().detail;
  EXPECT_EQ(resolver.snapshot_bytes(), 0u);
  ::close(writer);
  auto served = fetch(resolver, "a");
  ASSERT_TRUE(served) << served.error().message();
  EXPECT_EQ(first_byte(served.value()), 'a');
}

TEST_F(FileResolverTest, AWritableSharedMappingIsAWriterEvenAfterItsDescriptorIsClosed) {
  write_file("a", 4096, 'a');
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  auto before = fetch(resolver, "a");
  ASSERT_TRUE(before);
  const int fd = ::open((dir / "a").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* mapping = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(mapping, MAP_FAILED);
  ::close(fd);
  static_cast<char*>(mapping)[0] = 'm';  // a write no event reports
  auto refused = fetch(resolver, "a");
  ASSERT_FALSE(refused) << "a kept snapshot was handed out while a mapping could write the file";
  EXPECT_TRUE(refused.error().is(errc::object_changed)) << refused.error().message();
  ::munmap(mapping, 4096);
  auto after = fetch(resolver, "a");
  ASSERT_TRUE(after) << after.error().message();
  EXPECT_EQ(first_byte(after.value()), 'm');
  EXPECT_EQ(first_byte(before.value()), 'a');
}

TEST_F(FileResolverTest, TruncationAndExtensionGiveWholeNewVersions) {
  write_file("a", 8192, 'a');
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  ASSERT_TRUE(fetch(resolver, "a"));
  ASSERT_EQ(::truncate((dir / "a").c_str(), 100), 0);
  EXPECT_EQ(fetch(resolver, "a").value().bytes.size(), 100u);
  ASSERT_EQ(::truncate((dir / "a").c_str(), 10000), 0);
  auto extended = fetch(resolver, "a");
  ASSERT_TRUE(extended);
  EXPECT_EQ(extended.value().bytes.size(), 10000u);
  EXPECT_EQ(static_cast<char>(extended.value().bytes[9999]), '\0');
}

TEST_F(FileResolverTest, ANameThroughASymlinkIsServedButNotKept) {
  write_file("a", 4096, 'a');
  fs::create_symlink(dir / "a", dir / "link");
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  const void* first = fetch(resolver, "link").value().keepalive.get();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(resolver.snapshot_bytes(), 0u) << "a snapshot reached through a symlink was kept";
}

TEST_F(FileResolverTest, NamesThatAreNotPlainRelativePathsAreRefusedAsNotOwned) {
  write_file("f_4096", 4096, 'a');
  fs::create_directories(dir / "d");
  write_file("d/f", 10, 'f');
  auto resolver = FileResolver::create(dir, 1 << 20).value();
  using namespace std::string_literals;
  for (const auto& name : {"f_4096\0"s, "f_4096\0../x"s, "\0f_4096"s, "f_4096\n"s, "f\x7f"s, "d//f"s, "./f_4096"s,
                           "d/./f"s, "d/f/"s, "/d/f"s, "d/../f_4096"s, ".."s, "."s}) {
    auto refused = resolver(name);
    ASSERT_FALSE(refused) << "served '" << name << "'";
    EXPECT_TRUE(refused.error().is(errc::not_owned)) << refused.error().message();
  }
  EXPECT_TRUE(resolver("f_4096"));
  EXPECT_TRUE(resolver("d/f"));
  EXPECT_TRUE(resolver(std::string(5000, 'n')).error().is(errc::out_of_range));
}

TEST_F(FileResolverTest, IdleSnapshotsMakeRoomLeastRecentlyUsedFirstButNeverOneBeingRead) {
  write_file("a", 4000, 'a');
  write_file("b", 4000, 'b');
  write_file("c", 4000, 'c');
  // No wait for room: a read that finds none is refused at once.
  auto resolver = FileResolver::create(dir, 10000, std::chrono::milliseconds(0)).value();
  ASSERT_TRUE(fetch(resolver, "a"));
  ASSERT_TRUE(fetch(resolver, "b"));
  ASSERT_TRUE(fetch(resolver, "a"));  // a is now the more recently used
  auto read_c = fetch(resolver, "c");  // 12000 > 10000: b (idle, older) goes
  ASSERT_TRUE(read_c) << read_c.error().message();
  EXPECT_EQ(resolver.snapshot_bytes(), 8000u);

  auto read_a = fetch(resolver, "a");  // kept: no room needed
  ASSERT_TRUE(read_a);
  // a and c are both being read: b cannot come back.
  auto refused = fetch(resolver, "b");
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::budget_exceeded)) << refused.error().message();
  EXPECT_EQ(first_byte(read_a.value()), 'a');
  EXPECT_EQ(first_byte(read_c.value()), 'c');
}

/// Look-ups answered on a thread pool of file threads, as corma serve
/// makes them, each recorded when its answer comes.
class Askers {
 public:
  explicit Askers(const FileResolver& resolver) : resolver_(resolver) {}
  ~Askers() { readers_.join(); }

  /// Asks for `name`; `give_up` cancels the look-up.
  void ask(const std::string& name, boost::asio::cancellation_signal* give_up = nullptr) {
    auto record = [this, name](Result<PublishedObject> found) {
      {
        std::lock_guard lock(mutex_);
        found_.insert_or_assign(name, std::move(found));
      }
      answered_.notify_all();
    };
    if (give_up == nullptr) return resolver_.resolve(name, readers_.get_executor(), std::move(record));
    resolver_.resolve(name, readers_.get_executor(), boost::asio::bind_cancellation_slot(give_up->slot(), std::move(record)));
  }
  /// Whether `name` was answered (without waiting).
  bool answered(const std::string& name) {
    std::lock_guard lock(mutex_);
    return found_.contains(name);
  }
  /// The answer for `name`, waited for up to five seconds.
  std::optional<Result<PublishedObject>> answer(const std::string& name) {
    std::unique_lock lock(mutex_);
    if (!answered_.wait_for(lock, std::chrono::seconds(5), [&] { return found_.contains(name); })) return std::nullopt;
    return found_.at(name);
  }

 private:
  const FileResolver& resolver_;
  boost::asio::thread_pool readers_{2};
  std::mutex mutex_;
  std::condition_variable answered_;
  std::map<std::string, Result<PublishedObject>> found_;
};

TEST_F(FileResolverTest, AReadThatFindsTheLimitSpentWaitsItsTurnForRoomAndIsServedWhenAReaderLetsGo) {
  // a and b are being read and fill the limit but 2000 bytes: c (4000)
  // waits in line, and d (1000), asked after it, waits behind it although
  // it would fit, so that a large file is never starved by small ones. When
  // a's reader lets go, a goes (idle), c gets its room and then d.
  write_file("a", 4000, 'a');
  write_file("b", 4000, 'b');
  write_file("c", 4000, 'c');
  write_file("d", 1000, 'd');
  auto resolver = FileResolver::create(dir, 10000, std::chrono::seconds(30)).value();
  auto read_a = fetch(resolver, "a");
  auto read_b = fetch(resolver, "b");
  ASSERT_TRUE(read_a && read_b);
  Askers askers(resolver);
  resolver.refresh();
  askers.ask("c");
  ASSERT_TRUE(resolver.wait_for_reads_waiting_for_room(1, std::chrono::seconds(5)));
  askers.ask("d");
  ASSERT_TRUE(resolver.wait_for_reads_waiting_for_room(2, std::chrono::seconds(5)))
      << "a small file passed a larger one waiting for room before it";
  EXPECT_FALSE(askers.answered("c"));
  EXPECT_FALSE(askers.answered("d"));
  EXPECT_EQ(resolver.snapshot_bytes(), 8000U);

  read_a = fail(errc::cancelled, "let go");  // a's reader lets go
  for (const auto* name : {"c", "d"}) {
    auto found = askers.answer(name);
    ASSERT_TRUE(found.has_value()) << name << " was never answered";
    ASSERT_TRUE(*found) << found->error().message();
    EXPECT_EQ(first_byte(found->value()), *name);
  }
  EXPECT_EQ(resolver.reads_waiting_for_room(), 0U);
  EXPECT_EQ(resolver.snapshot_bytes(), 9000U) << "b, c and d, with a let go";
  EXPECT_EQ(first_byte(read_b.value()), 'b');
}

TEST_F(FileResolverTest, AReadWaitingForRoomLeavesTheLineWhenGivenUpOrWhenItsWaitEnds) {
  write_file("a", 6000, 'a');
  write_file("b", 6000, 'b');
  write_file("huge", 20000, 'h');
  auto resolver = FileResolver::create(dir, 10000, std::chrono::milliseconds(200)).value();
  auto read_a = fetch(resolver, "a");
  ASSERT_TRUE(read_a);
  // More than the whole limit: refused at once, never in line.
  auto huge = fetch(resolver, "huge");
  ASSERT_FALSE(huge);
  EXPECT_TRUE(huge.error().is(errc::budget_exceeded)) << huge.error().message();

  // Given up while in line: answered at once, and the line is empty again.
  {
    Askers askers(resolver);
    boost::asio::cancellation_signal give_up;
    resolver.refresh();
    askers.ask("b", &give_up);
    ASSERT_TRUE(resolver.wait_for_reads_waiting_for_room(1, std::chrono::seconds(5)));
    give_up.emit(boost::asio::cancellation_type::terminal);
    auto found = askers.answer("b");
    ASSERT_TRUE(found.has_value());
    ASSERT_FALSE(*found);
    EXPECT_TRUE(found->error().is(errc::cancelled)) << found->error().message();
    EXPECT_TRUE(resolver.wait_for_reads_waiting_for_room(0, std::chrono::seconds(5)))
        << "a read nobody wants stayed in line";
  }
  // Its wait over with a still read: refused, and out of the line.
  const auto start = std::chrono::steady_clock::now();
  auto refused = fetch(resolver, "b");
  ASSERT_FALSE(refused);
  EXPECT_TRUE(refused.error().is(errc::budget_exceeded)) << refused.error().message();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200)) << "refused before its wait ended";
  EXPECT_EQ(resolver.reads_waiting_for_room(), 0U);
  EXPECT_EQ(resolver.snapshot_bytes(), 6000U);
}

}  // namespace
}  // namespace corma::cli
