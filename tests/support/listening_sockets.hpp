// The TCP sockets a process listens on, read from /proc (Linux): the
// listening entries of /proc/PID/net/tcp and tcp6 whose inode is one of the
// process's own descriptors (those tables list the whole network namespace).
#pragma once

#include <boost/asio/ip/tcp.hpp>

#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace corma::testing {

namespace detail {

/// The socket inodes behind a process's descriptors ("socket:[N]" links).
inline std::set<std::uint64_t> socket_inodes(const std::string& proc) {
  std::set<std::uint64_t> inodes;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    const auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.starts_with("socket:[")) inodes.insert(std::stoull(target.substr(8)));
  }
  return inodes;
}

/// "0100007F:1F90" (tcp) or 32 hex digits and a port (tcp6): the kernel
/// prints each 32-bit word of the address in host order.
inline boost::asio::ip::tcp::endpoint parse_endpoint(const std::string& text) {
  const auto colon = text.find(':');
  const auto hex = text.substr(0, colon);
  const auto port = static_cast<unsigned short>(std::stoul(text.substr(colon + 1), nullptr, 16));
  auto word_bytes = [&hex](std::size_t word, unsigned char* out) {
    const auto value = static_cast<std::uint32_t>(std::stoul(hex.substr(word * 8, 8), nullptr, 16));
    for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));  // little-endian host
  };
  if (hex.size() == 8) {
    boost::asio::ip::address_v4::bytes_type bytes{};
    word_bytes(0, bytes.data());
    return {boost::asio::ip::address_v4(bytes), port};
  }
  boost::asio::ip::address_v6::bytes_type bytes{};
  for (std::size_t word = 0; word < 4; ++word) word_bytes(word, bytes.data() + word * 4);
  return {boost::asio::ip::address_v6(bytes), port};
}

}  // namespace detail

/// Where process `pid` (this one by default) listens for TCP connections.
inline std::vector<boost::asio::ip::tcp::endpoint> listening_sockets(pid_t pid = ::getpid()) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const auto mine = detail::socket_inodes(proc);
  std::vector<boost::asio::ip::tcp::endpoint> listening;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream fields(line);
      std::array<std::string, 10> f;
      for (auto& field : f) fields >> field;
      constexpr const char* listen_state = "0A";
      if (f[3] == listen_state && mine.contains(std::stoull(f[9]))) listening.push_back(detail::parse_endpoint(f[1]));
    }
  }
  return listening;
}

}  // namespace corma::testing
