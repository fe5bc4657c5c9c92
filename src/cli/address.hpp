// HOST:PORT on the command line.
#pragma once

#include <corma/error.hpp>

#include <boost/asio/ip/tcp.hpp>

#include <string_view>

namespace corma::cli {

/// Numeric IPv4/IPv6 ("[::1]:7000") or "localhost"; port 0 means any.
[[nodiscard]] Result<boost::asio::ip::tcp::endpoint> parse_endpoint(std::string_view text);

}  // namespace corma::cli
