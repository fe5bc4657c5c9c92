// `corma serve --directory`, `corma get --directory` and `corma ls` as real
// processes against a real etcd: owners announce themselves, a get needs
// no owner address, and an owner killed (SIGKILL) in the middle of a fetch
// is replaced by a replica, the file arriving byte for byte; the only owner
// killed ends the get with a clear error within the lease's time to live,
// and its entries leave the directory with the lease.
#include "cli/processes.hpp"
#include "directory/etcd_client.hpp"
#include "directory/etcd_server.hpp"
#include "directory/records.hpp"
#include "support/run.hpp"
#include "support/test_certificates.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

namespace corma::cli::testing {
namespace {

namespace asio = boost::asio;

class DirectoryCli : public TwoProcesses {
 protected:
  corma::testing::EtcdServer etcd;
  std::string directory;

  void SetUp() override {
    if (auto missing = corma::testing::EtcdServer::missing()) GTEST_SKIP() << *missing;
    TwoProcesses::SetUp();
    ASSERT_TRUE(etcd.start()) << "etcd did not start";
    directory = "127.0.0.1:" + std::to_string(etcd.config("").port);
  }

  Process announced_owner(const std::string& id) {
    auto owner = serve({"--directory", directory, "--owner-id", id, "--announce-ttl", "2"});
    // Announced (in etcd), not only announcing: a get may follow at once.
    EXPECT_TRUE(owner.wait_for_output("announced " + id)) << owner.captured;
    return owner;
  }
};

TEST_F(DirectoryCli, AGetNeedsNoOwnerAddressAndLsListsWhatIsAnnounced) {
  write_file(root / "sub" / "model.bin", std::vector<char>(100000, 'm'));
  auto owner = announced_owner("owner-one");
  auto [listed_status, listing] = run_corma({"ls", "--directory", directory});
  EXPECT_EQ(listed_status, 0) << listing;
  EXPECT_NE(listing.find("owner-one"), std::string::npos) << listing;
  const auto out = base / "model.out";
  auto [status, output] = run_corma({"get", "--directory", directory, "sub/model.bin", "-o", out.string()});
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("from owner-one"), std::string::npos) << output;
  EXPECT_EQ(read_file(out), read_file(root / "sub" / "model.bin"));
  auto [missing_status, missing] =
      run_corma({"get", "--directory", directory, "sub/none", "-o", (base / "none.out").string()});
  EXPECT_EQ(missing_status, 1) << missing;
}

TEST_F(DirectoryCli, LsEscapesWhatAnEtcdWriterChoseSoNoEntryForgesALineAColumnOrATerminalSequence) {
  // Written straight to etcd, as anyone with write access could: a name
  // with a terminal sequence, a newline and a tab, and an owner entry whose
  // host (quoted in the reason it is skipped) sets the terminal's title.
  asio::io_context io;
  const auto c = etcd.config("/corma");
  directory::EtcdClient writer(io.get_executor(), "127.0.0.1", c.port, std::chrono::seconds(2));
  const std::string forged_name = "evil\x1b[2Jname\nforged\towner";
  const std::string evil_entry =
      "{\"host\": \"\\u001b]0;owned\\u0007\", \"port\": 7000, \"machine\": \"m\", \"transport\": \"tcp\", "
      "\"protocol\": 6, \"load\": 0}";
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await writer.put(directory::name_key(c, forged_name, "owner-gone"), "", 0));
    EXPECT_TRUE(co_await writer.put(directory::owner_key(c, "evil-host"), evil_entry, 0));
    EXPECT_TRUE(co_await writer.put(directory::name_key(c, "plain-\xc3\xa9", "evil-host"), "", 0));
  }());
  auto [status, listing] = run_corma({"ls", "--directory", directory});
  ASSERT_EQ(status, 0) << listing;
  EXPECT_EQ(listing.find('\x1b'), std::string::npos) << "a raw escape reached the terminal";
  EXPECT_EQ(listing.find('\x07'), std::string::npos);
  EXPECT_EQ(std::count(listing.begin(), listing.end(), '\n'), 2) << "a name forged a line:\n" << listing;
  EXPECT_NE(listing.find("evil\\x1b[2Jname\\x0aforged\\x09owner\towner-gone\t"), std::string::npos) << listing;
  EXPECT_NE(listing.find("\\x1b]0;owned\\x07"), std::string::npos) << listing;
  EXPECT_NE(listing.find("plain-\xc3\xa9\tevil-host"), std::string::npos) << "UTF-8 text is left as it is:\n" << listing;
}

TEST_F(DirectoryCli, LsShowsTheVersionsOwnersAnnounceAndGetVersionFetchesOnlyFromAnOwnerHoldingIt) {
  write_file(root / "model.bin", std::vector<char>(100000, 'v'));
  auto a = announced_owner("owner-a");
  auto b = announced_owner("owner-b");
  // Each owner says, for the name, the version it holds (written as an
  // owner announcing it would: a name key whose value names the version).
  asio::io_context io;
  const auto c = etcd.config("/corma");
  directory::EtcdClient writer(io.get_executor(), "127.0.0.1", c.port, std::chrono::seconds(2));
  corma::testing::run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await writer.put(directory::name_key(c, "model.bin", "owner-a"), directory::encode_name_value(7), 0));
    EXPECT_TRUE(co_await writer.put(directory::name_key(c, "model.bin", "owner-b"), directory::encode_name_value(9), 0));
  }());
  auto [listed, listing] = run_corma({"ls", "--directory", directory, "model"});
  ASSERT_EQ(listed, 0) << listing;
  EXPECT_NE(listing.find("model.bin\towner-a\tversion 7\n"), std::string::npos) << listing;
  EXPECT_NE(listing.find("model.bin\towner-b\tversion 9\n"), std::string::npos) << listing;

  const auto out = base / "model.out";
  auto [newest, newest_line] = run_corma({"get", "--directory", directory, "model.bin", "-o", out.string()});
  ASSERT_EQ(newest, 0) << newest_line;
  EXPECT_NE(newest_line.find(", version 9 from owner-b"), std::string::npos) << "the newest first:\n" << newest_line;
  auto [older, older_line] =
      run_corma({"get", "--directory", directory, "model.bin", "-o", out.string(), "--version", "7"});
  ASSERT_EQ(older, 0) << older_line;
  EXPECT_NE(older_line.find(", version 7 from owner-a"), std::string::npos) << older_line;
  EXPECT_EQ(read_file(out), read_file(root / "model.bin"));
  auto [none, none_line] =
      run_corma({"get", "--directory", directory, "model.bin", "-o", (base / "none.out").string(), "--version", "8"});
  EXPECT_EQ(none, 1) << none_line;
  EXPECT_NE(none_line.find("no owner announces version 8 of 'model.bin'"), std::string::npos) << none_line;
  EXPECT_FALSE(std::filesystem::exists(base / "none.out"));
}

/// Sets `file`'s modification time to `version` nanoseconds since the epoch.
void set_version(const std::filesystem::path& file, std::uint64_t version) {
  const timespec times[2] = {{static_cast<time_t>(version / 1'000'000'000u), 0},
                             {static_cast<time_t>(version / 1'000'000'000u), static_cast<long>(version % 1'000'000'000u)}};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
}

TEST_F(DirectoryCli, ServeAnnounceFilesAnnouncesEachFilesVersionAndAChangeAfterTheNextScanUnderTheSameLease) {
  // Two replicas of one file whose copies differ, each with its own time.
  constexpr std::uint64_t older = 1'700'000'000'000'000'111u, newer = 1'700'000'100'000'000'222u,
                          newest = 1'700'000'200'000'000'333u;
  const auto root_b = base / "root-b";
  std::filesystem::create_directories(root_b / "sub");
  write_file(root / "model.bin", std::vector<char>(100000, 'a'));
  write_file(root_b / "model.bin", std::vector<char>(100000, 'b'));
  set_version(root / "model.bin", older);
  set_version(root_b / "model.bin", newer);
  const auto serve_files = [&](const std::filesystem::path& served, const std::string& id) {
    auto owner = Process::start({binary, "serve", "--root", served.string(), "--listen", "127.0.0.1:0", "--metrics",
                                 "127.0.0.1:0", "--directory", directory, "--owner-id", id, "--announce-ttl", "2",
                                 "--announce-files", "--announce-rescan", "0.2"});
    EXPECT_TRUE(owner.wait_for_output("announced " + id + ", 3 files by name")) << owner.captured;
    return owner;
  };
  write_file(root_b / "sub" / "one.bin", std::vector<char>(10, '1'));
  write_file(root_b / "sub" / "two.bin", std::vector<char>(10, '2'));
  write_file(root / "sub" / "one.bin", std::vector<char>(10, '1'));
  write_file(root / "sub" / "two.bin", std::vector<char>(10, '2'));
  auto a = serve_files(root, "owner-a");
  auto b = serve_files(root_b, "owner-b");
  auto [listed, listing] = run_corma({"ls", "--directory", directory, "model"});
  ASSERT_EQ(listed, 0) << listing;
  EXPECT_NE(listing.find("model.bin\towner-a\tversion " + std::to_string(older)), std::string::npos) << listing;
  EXPECT_NE(listing.find("model.bin\towner-b\tversion " + std::to_string(newer)), std::string::npos) << listing;

  const auto out = base / "model.out";
  auto [got, line] = run_corma({"get", "--directory", directory, "model.bin", "-o", out.string()});
  ASSERT_EQ(got, 0) << line;
  EXPECT_NE(line.find(", version " + std::to_string(newer) + " from owner-b"), std::string::npos) << line;
  EXPECT_EQ(read_file(out), read_file(root_b / "model.bin"));
  auto [got_older, older_line] = run_corma(
      {"get", "--directory", directory, "model.bin", "-o", out.string(), "--version", std::to_string(older)});
  ASSERT_EQ(got_older, 0) << older_line;
  EXPECT_EQ(read_file(out), read_file(root / "model.bin"));

  // owner-a's copy is rewritten: its next scan announces the new version.
  write_file(root / "model.bin", std::vector<char>(100000, 'c'));
  set_version(root / "model.bin", newest);
  const auto announced = "model.bin\towner-a\tversion " + std::to_string(newest);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string now_listed;
  while (now_listed.find(announced) == std::string::npos && std::chrono::steady_clock::now() < until) {
    now_listed = run_corma({"ls", "--directory", directory, "model"}).second;
  }
  ASSERT_NE(now_listed.find(announced), std::string::npos) << now_listed;
  auto [got_newest, newest_line] = run_corma({"get", "--directory", directory, "model.bin", "-o", out.string()});
  ASSERT_EQ(got_newest, 0) << newest_line;
  EXPECT_NE(newest_line.find(" from owner-a"), std::string::npos) << newest_line;
  EXPECT_EQ(read_file(out), read_file(root / "model.bin"));
  const auto metrics_a = static_cast<unsigned short>(std::stoi(port_after(a.captured, "metrics on http://")));
  EXPECT_EQ(metric(http_get(metrics_a, "/metrics"), "corma_directory_leases_granted_total"), 1u)
      << "announced anew under the lease it held";
  auto [old_gone, old_gone_line] = run_corma(
      {"get", "--directory", directory, "model.bin", "-o", out.string(), "--version", std::to_string(older)});
  EXPECT_EQ(old_gone, 1) << old_gone_line;
}

TEST_F(DirectoryCli, AnOwnerKilledMidFetchIsReplacedByAReplicaAndTheFileArrivesWhole) {
  std::vector<char> content(256u << 20);
  for (std::size_t i = 0; i < content.size(); i += 4096) content[i] = static_cast<char>(i / 4096 * 7);
  write_file(root / "big.bin", content);
  auto first = announced_owner("owner-a");
  auto second = announced_owner("owner-b");
  const auto metrics_a = static_cast<unsigned short>(std::stoi(port_after(first.captured, "metrics on http://")));
  const auto metrics_b = static_cast<unsigned short>(std::stoi(port_after(second.captured, "metrics on http://")));
  const auto out = base / "big.out";
  auto get = Process::start({binary, "get", "--directory", directory, "big.bin", "-o", out.string(), "--no-rdma",
                             "--pull-window", "1"});
  // Whichever owner the directory ranked first is serving it: kill that one
  // once it has sent some chunks.
  Process* serving = nullptr;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (serving == nullptr && std::chrono::steady_clock::now() < until) {
    if (metric(http_get(metrics_a, "/metrics"), "corma_owner_pulls_total") > 2) serving = &first;
    if (metric(http_get(metrics_b, "/metrics"), "corma_owner_pulls_total") > 2) serving = &second;
  }
  ASSERT_NE(serving, nullptr) << "no owner started serving";
  const auto replica_metrics = serving == &first ? metrics_b : metrics_a;
  const auto replica_pulls = [&] { return metric(http_get(replica_metrics, "/metrics"), "corma_owner_pulls_total"); };
  const auto pulls_before = replica_pulls();
  ::kill(serving->pid, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  // The takeover is timed to the replica's first chunk, not to the end of
  // the file: the fetch starts again from the first byte, and how long the
  // rest takes is the build's speed (a sanitizer build reads far slower).
  std::optional<std::chrono::steady_clock::duration> took_over;
  while (!took_over && std::chrono::steady_clock::now() < killed + std::chrono::seconds(10)) {
    if (replica_pulls() > pulls_before) took_over = std::chrono::steady_clock::now() - killed;
  }
  auto status = get.wait_exit(std::chrono::seconds(60));
  ASSERT_EQ(status.value_or(-1), 0) << get.captured;
  ASSERT_TRUE(took_over) << "the replica never served a chunk";
  const std::string killed_id = serving == &first ? "owner-a" : "owner-b";
  const std::string other_id = serving == &first ? "owner-b" : "owner-a";
  EXPECT_NE(get.captured.find("from " + other_id + " (" + killed_id + " failed"), std::string::npos) << get.captured;
  EXPECT_LT(*took_over, std::chrono::seconds(2)) << "the replica took over too late";
  EXPECT_EQ(read_file(out), content);
}

TEST_F(DirectoryCli, TheOnlyOwnerKilledMidFetchEndsTheGetClearlyWithinTheLeaseTtlAndLeavesTheDirectory) {
  constexpr auto lease_ttl = std::chrono::seconds(2);  // announced_owner's --announce-ttl
  // Sparse: the owner still reads and sends every byte of it.
  std::ofstream(root / "huge.bin").close();
  std::filesystem::resize_file(root / "huge.bin", 1ull << 30);
  auto only = announced_owner("owner-only");
  const auto metrics_port = static_cast<unsigned short>(std::stoi(port_after(only.captured, "metrics on http://")));
  auto get = Process::start({binary, "get", "--directory", directory, "huge.bin", "-o",
                             (base / "huge.out").string(), "--no-rdma", "--pull-window", "1"});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (metric(http_get(metrics_port, "/metrics"), "corma_owner_pulls_total") <= 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "the owner never started serving:\n" << get.captured;
  }
  ASSERT_EQ(::kill(only.pid, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  const auto status = get.wait_exit(lease_ttl);
  ASSERT_TRUE(status.has_value()) << "corma get still running a lease ttl after its only owner died:\n"
                                  << get.captured;
  EXPECT_EQ(*status, 1) << get.captured;
  EXPECT_NE(get.captured.find("peer unreachable"), std::string::npos) << get.captured;
  EXPECT_NE(get.captured.find("owner-only"), std::string::npos) << "the error names the owner that failed:\n"
                                                                  << get.captured;

  // Its entries go with its lease (no withdrawal: it was killed).
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < killed + lease_ttl + std::chrono::seconds(3)) {
    auto [listed, listing] = run_corma({"ls", "--directory", directory});
    gone = listed == 0 && listing.find("owner-only") == std::string::npos;
  }
  EXPECT_TRUE(gone) << "the dead owner's entries outlived its lease";
}

TEST_F(DirectoryCli, WithAClusterKeyAGetTakesTheOwnerThatProvesItAndRefusesOneThatCannot) {
  write_file(root / "keyed.bin", std::vector<char>(50000, 'k'));
  write_file(base / "cluster.key", std::vector<char>(32, 'K'));
  write_file(base / "other.key", std::vector<char>(32, 'X'));
  const auto key = (base / "cluster.key").string();
  auto good = serve({"--directory", directory, "--owner-id", "owner-good", "--cluster-key", key});
  ASSERT_TRUE(good.wait_for_output("announced owner-good")) << good.captured;
  EXPECT_NE(good.captured.find("proves to consumers that it is 'owner-good'"), std::string::npos) << good.captured;
  auto bad = serve({"--directory", directory, "--owner-id", "owner-bad", "--cluster-key", (base / "other.key").string()});
  ASSERT_TRUE(bad.wait_for_output("announced owner-bad")) << bad.captured;

  const auto out = base / "keyed.out";
  auto [status, output] = run_corma({"get", "--directory", directory, "keyed.bin", "-o", out.string(), "--cluster-key", key});
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("from owner-good"), std::string::npos) << output;
  EXPECT_EQ(read_file(out), read_file(root / "keyed.bin"));

  // Asked directly, the owner with another key is refused, and says why.
  const std::string bad_owner = "127.0.0.1:" + port_after(bad.captured, "listening on");
  auto [refused_status, refused] =
      run_corma({"get", bad_owner, "keyed.bin", "-o", (base / "refused.out").string(), "--cluster-key", key});
  EXPECT_EQ(refused_status, 1) << refused;
  EXPECT_NE(refused.find("did not prove it holds the cluster key"), std::string::npos) << refused;
  EXPECT_FALSE(std::filesystem::exists(base / "refused.out")) << "a refused get left its output behind";

  // A key file too short to be a key is refused before anything starts.
  write_file(base / "short.key", std::vector<char>(8, 's'));
  auto [short_status, short_output] = run_corma(
      {"get", bad_owner, "keyed.bin", "-o", (base / "short.out").string(), "--cluster-key", (base / "short.key").string()});
  EXPECT_EQ(short_status, 2) << short_output;
}

/// The same commands against an etcd that speaks TLS only and asks each
/// client for a certificate its CA signed.
class DirectoryCliOverTls : public TwoProcesses {
 protected:
  corma::testing::TestCertificates pki;
  corma::testing::EtcdProcess etcd;
  std::string directory;

  void SetUp() override {
    if (auto missing = corma::testing::EtcdProcess::missing()) GTEST_SKIP() << *missing;
    if (auto missing = pki.missing()) GTEST_SKIP() << *missing;
    TwoProcesses::SetUp();
    etcd.with_tls(pki.server_cert(), pki.server_key(), pki.ca());
    ASSERT_TRUE(etcd.start()) << "etcd said:\n" << etcd.output();
    directory = "https://127.0.0.1:" + std::to_string(etcd.client_port());
  }

  /// The flags that reach it: its CA, a client certificate and its key.
  std::vector<std::string> tls_flags() const {
    return {"--directory",      directory,          "--directory-cacert", pki.ca(), "--directory-cert",
            pki.client_cert(), "--directory-key", pki.client_key()};
  }
};

TEST_F(DirectoryCliOverTls, ServeGetAndLsWorkWithTheCaAndAClientCertificateAndAGetWithoutThemSaysWhy) {
  write_file(root / "model.bin", std::vector<char>(100000, 't'));
  auto args = tls_flags();
  args.push_back("--owner-id");
  args.push_back("owner-tls");
  auto owner = serve(args);
  ASSERT_TRUE(owner.wait_for_output("announced owner-tls")) << owner.captured;

  auto ls = tls_flags();
  ls.insert(ls.begin(), "ls");
  auto [listed_status, listing] = run_corma(ls);
  EXPECT_EQ(listed_status, 0) << listing;
  EXPECT_NE(listing.find("owner-tls"), std::string::npos) << listing;

  const auto out = base / "model.out";
  std::vector<std::string> get = {"get", "model.bin", "-o", out.string()};
  for (const auto& flag : tls_flags()) get.push_back(flag);
  auto [status, output] = run_corma(get);
  ASSERT_EQ(status, 0) << output;
  EXPECT_EQ(read_file(out), read_file(root / "model.bin"));

  // Trusting no CA of this etcd's, the get reaches no directory and says so.
  auto [refused_status, refused] = run_corma({"get", "--directory", directory, "model.bin", "-o",
                                              (base / "refused.out").string()});
  EXPECT_NE(refused_status, 0) << refused;
  EXPECT_NE(refused.find("certificate verify failed"), std::string::npos) << refused;
}

}  // namespace
}  // namespace corma::cli::testing
