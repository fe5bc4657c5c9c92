#include "owner_names.hpp"

#include "bench_support.hpp"
#include "file_server.hpp"
#include "rendezvous/protocol/messages.hpp"

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace corma::bench {

namespace asio = boost::asio;
namespace rv = rendezvous;

namespace {

constexpr std::size_t batch = 251;
constexpr std::size_t file_size = 4 * KiB;

/// A directory of `count` small files, gone with the object.
struct SmallFiles {
  std::filesystem::path root;
  std::vector<std::string> names;

  explicit SmallFiles(std::size_t count) {
    std::string pattern = (std::filesystem::temp_directory_path() / "corma-bench-names-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    root = pattern;
    const std::string bytes(file_size, 'n');
    for (std::size_t i = 0; i < count; ++i) {
      names.push_back("f_" + std::to_string(i));
      const int fd = ::open((root / names.back()).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0 || ::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) {
        throw std::runtime_error("cannot write a served file");
      }
      ::close(fd);
    }
  }
  ~SmallFiles() {
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }
  SmallFiles(const SmallFiles&) = delete;
  SmallFiles& operator=(const SmallFiles&) = delete;
};

/// A client speaking the protocol frame by frame over a blocking socket.
class RawClient {
 public:
  explicit RawClient(const asio::ip::tcp::endpoint& owner) : socket_(io_) {
    socket_.connect(owner);
    socket_.set_option(asio::ip::tcp::no_delay(true));
    auto hello = ask(rv::Hello{rv::protocol_version, BackendId::none, {}});
    if (!std::holds_alternative<rv::HelloOk>(hello)) throw std::runtime_error("hello refused");
  }

  rv::Message ask(rv::Message message) {
    const auto bytes = rv::encode_frame(rv::Frame{++id_, std::move(message)});
    asio::write(socket_, asio::buffer(bytes));
    std::array<std::byte, 4> prefix{};
    asio::read(socket_, asio::buffer(prefix));
    const auto length = must(rv::decode_frame_length(prefix, rv::default_max_frame_body), "frame length");
    body_.resize(length);
    asio::read(socket_, asio::buffer(body_));
    return must(rv::decode_frame_body(body_), "frame").message;
  }

 private:
  asio::io_context io_;
  asio::ip::tcp::socket socket_;
  std::vector<std::byte> body_;
  std::uint64_t id_ = 0;
};

/// Seconds for one acquire_many of `names` (their leases released after,
/// untimed).
double acquire_seconds(RawClient& client, const std::vector<std::string>& names) {
  const auto start = clock_type::now();
  auto answer = client.ask(rv::AcquireMany{names, false});
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  auto* granted = std::get_if<rv::Granted>(&answer);
  if (granted == nullptr || granted->grants.size() != names.size()) throw std::runtime_error("acquire_many failed");
  rv::ReleaseMany release;
  for (const auto& grant : granted->grants) {
    const auto* chunked = std::get_if<rv::Chunked>(&grant);
    if (chunked == nullptr) throw std::runtime_error("a name was not granted");
    release.leases.push_back(chunked->lease);
  }
  (void)client.ask(std::move(release));
  return seconds;
}

}  // namespace

Measurement owner_name_cost(const Options& options) {
  Measurement m{"acquire_many", "tcp", "names=" + std::to_string(batch) + " cached", "us/name", false, {}, {}, {},
                true};
  SmallFiles files(batch);
  FileServer server(files.root, nullptr);
  RawClient client(server.acceptor.local_endpoint());
  const std::vector<std::string> one{files.names.front()};
  (void)acquire_seconds(client, files.names);  // the snapshots are read once, then kept
  const int repeats = static_cast<int>(50 * options.bytes_scale) + 5;
  for (int r = 0; r < options.rounds; ++r) {
    std::vector<double> whole, single;
    for (int i = 0; i < repeats; ++i) {
      whole.push_back(acquire_seconds(client, files.names));
      single.push_back(acquire_seconds(client, one));
    }
    const double extra = percentile(whole, 0.5) - percentile(single, 0.5);
    m.corma.push_back(extra / static_cast<double>(batch - 1) * 1e6);
  }
  m.target = "<= 2 us/name";
  m.target_met = m.corma_median() <= 2.0;
  return m;
}

}  // namespace corma::bench
