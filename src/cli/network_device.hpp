// Which network device an address lives on: trusted UCX over tcp listens on
// that one device only, the one the operator named by its address.
#pragma once

#include <corma/error.hpp>

#include <boost/asio/ip/tcp.hpp>

#include <string>

namespace corma::cli {

/// The device (as `ip link` names it) holding `address`: the interface with
/// that very address, else the first whose network contains it (127.0.0.2 is
/// on the loopback device). `not_configured` for a wildcard address (it
/// names every interface) or one no interface holds.
[[nodiscard]] Result<std::string> device_holding(const boost::asio::ip::address& address);

/// The local address this host would send from to reach `peer`, from the
/// routing table (nothing is sent). `peer_unreachable` when there is no route.
[[nodiscard]] Result<boost::asio::ip::address> source_address_towards(const boost::asio::ip::tcp::endpoint& peer);

}  // namespace corma::cli
