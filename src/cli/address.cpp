#include "address.hpp"

#include <charconv>
#include <string>

namespace corma::cli {

Result<boost::asio::ip::tcp::endpoint> parse_endpoint(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return fail(errc::out_of_range, "expected HOST:PORT, got '" + std::string(text) + "'");
  auto host = text.substr(0, colon);
  const auto port_text = text.substr(colon + 1);
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || end != port_text.data() + port_text.size() || port > 65535) {
    return fail(errc::out_of_range, "bad port in '" + std::string(text) + "'");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code bad;
  const auto address = boost::asio::ip::make_address(std::string(host), bad);
  if (bad) return fail(errc::out_of_range, "bad host in '" + std::string(text) + "' (a numeric address or localhost)");
  return boost::asio::ip::tcp::endpoint(address, static_cast<unsigned short>(port));
}

}  // namespace corma::cli
