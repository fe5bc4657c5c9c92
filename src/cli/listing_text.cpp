#include "listing_text.hpp"

#include <cstdint>
#include <cstdio>

namespace corma::cli {

namespace {

/// The length of the well-formed UTF-8 sequence of a printable character at
/// the start of `rest` (no overlong forms, no surrogates, nothing past
/// U+10FFFF, no C1 control), or 0.
std::size_t printable_utf8(std::string_view rest) {
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(rest[i]); };
  const auto lead = byte(0);
  std::size_t length = 0;
  std::uint32_t code = 0;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2, code = lead & 0x1fu;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3, code = lead & 0x0fu;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4, code = lead & 0x07u;
  } else {
    return 0;
  }
  if (rest.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xc0u) != 0x80u) return 0;
    code = (code << 6) | (byte(i) & 0x3fu);
  }
  const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
  const bool surrogate = code >= 0xd800 && code <= 0xdfff;
  const bool c1_control = code >= 0x80 && code <= 0x9f;
  if (overlong || surrogate || c1_control || code > 0x10ffff) return 0;
  return length;
}

}  // namespace

std::string escaped_for_listing(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<std::uint8_t>(text[i]);
    if (c == '\\') {
      out += "\\\\";
      ++i;
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
    } else if (const auto length = c >= 0x80 ? printable_utf8(text.substr(i)) : 0; length > 0) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
      ++i;
    }
  }
  return out;
}

}  // namespace corma::cli
