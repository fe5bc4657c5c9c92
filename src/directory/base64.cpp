// Base64 for etcd's JSON gateway, with Boost's archive iterators (which
// neither pad nor accept padding: both are handled here).
#include "etcd_client.hpp"

#include <boost/archive/iterators/base64_from_binary.hpp>
#include <boost/archive/iterators/binary_from_base64.hpp>
#include <boost/archive/iterators/transform_width.hpp>

#include <algorithm>

namespace corma::directory {

namespace it = boost::archive::iterators;

std::string to_base64(std::string_view bytes) {
  using Encoder = it::base64_from_binary<it::transform_width<std::string_view::const_iterator, 6, 8>>;
  std::string text(Encoder(bytes.begin()), Encoder(bytes.end()));
  text.append((3 - bytes.size() % 3) % 3, '=');
  return text;
}

Result<std::string> from_base64(std::string_view text) {
  if (text.size() % 4 != 0) return fail(errc::protocol, "base64 text of a length not a multiple of 4");
  const auto padding = static_cast<std::size_t>(std::count(text.end() - std::min<std::size_t>(text.size(), 2),
                                                           text.end(), '='));
  const auto body = text.substr(0, text.size() - padding);
  const bool alphabet = std::all_of(body.begin(), body.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
  });
  if (!alphabet) return fail(errc::protocol, "not base64");
  using Decoder = it::transform_width<it::binary_from_base64<std::string_view::const_iterator>, 8, 6>;
  std::string bytes(Decoder(body.begin()), Decoder(body.end()));
  bytes.resize(text.size() / 4 * 3 - padding);
  return bytes;
}

}  // namespace corma::directory
