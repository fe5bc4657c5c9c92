#include "network_device.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>

#include <ifaddrs.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

namespace corma::cli {
namespace {

namespace ip = boost::asio::ip;

std::optional<ip::address> address_of(const sockaddr* raw) {
  if (raw == nullptr) return std::nullopt;
  if (raw->sa_family == AF_INET) {
    ip::address_v4::bytes_type bytes{};
    std::memcpy(bytes.data(), &reinterpret_cast<const sockaddr_in*>(raw)->sin_addr, bytes.size());
    return ip::address_v4(bytes);
  }
  if (raw->sa_family == AF_INET6) {
    ip::address_v6::bytes_type bytes{};
    std::memcpy(bytes.data(), &reinterpret_cast<const sockaddr_in6*>(raw)->sin6_addr, bytes.size());
    return ip::address_v6(bytes);
  }
  return std::nullopt;
}

template <class Bytes>
bool same_network(const Bytes& a, const Bytes& b, const Bytes& mask) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if ((a[i] & mask[i]) != (b[i] & mask[i])) return false;
  }
  return true;
}

bool same_network(const ip::address& a, const ip::address& b, const ip::address& mask) {
  if (a.is_v4()) return same_network(a.to_v4().to_bytes(), b.to_v4().to_bytes(), mask.to_v4().to_bytes());
  return same_network(a.to_v6().to_bytes(), b.to_v6().to_bytes(), mask.to_v6().to_bytes());
}

}  // namespace

Result<std::string> device_holding(const ip::address& address) {
  if (address.is_unspecified()) {
    return fail(errc::not_configured,
                address.to_string() + " is every interface: trusted tcp needs the address of one interface");
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return fail(errc::not_configured, std::string("getifaddrs: ") + std::strerror(errno));
  const std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owned(list, &::freeifaddrs);
  std::string containing;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    const auto own = address_of(i->ifa_addr);
    const auto mask = address_of(i->ifa_netmask);
    if (!own || own->is_v4() != address.is_v4()) continue;
    if (*own == address) return std::string(i->ifa_name);
    if (containing.empty() && mask && mask->is_v4() == address.is_v4() && same_network(*own, address, *mask)) {
      containing = i->ifa_name;
    }
  }
  if (!containing.empty()) return containing;
  return fail(errc::not_configured, "no network interface holds " + address.to_string());
}

Result<ip::address> source_address_towards(const ip::tcp::endpoint& peer) {
  // Connecting a UDP socket only asks the routing table which source it
  // would use.
  boost::asio::io_context io;
  ip::udp::socket socket(io);
  boost::system::error_code ec;
  socket.open(peer.address().is_v4() ? ip::udp::v4() : ip::udp::v6(), ec);
  if (!ec) socket.connect({peer.address(), peer.port()}, ec);
  const auto local = ec ? ip::udp::endpoint{} : socket.local_endpoint(ec);
  if (ec) return fail(errc::peer_unreachable, "no route to " + peer.address().to_string() + ": " + ec.message());
  return local.address();
}

}  // namespace corma::cli
