#include "sizes.hpp"

#include <cctype>
#include <charconv>
#include <cstdio>

namespace corma::cli {

Result<std::uint64_t> parse_size(std::string_view text) {
  std::uint64_t value = 0;
  const auto* end = text.data() + text.size();
  auto [next, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || next == text.data()) return fail(errc::out_of_range, "not a size: '" + std::string(text) + "'");
  std::uint64_t unit = 1;
  if (next != end) {
    switch (std::toupper(static_cast<unsigned char>(*next))) {
      case 'K': unit = 1ULL << 10; break;
      case 'M': unit = 1ULL << 20; break;
      case 'G': unit = 1ULL << 30; break;
      case 'T': unit = 1ULL << 40; break;
      default: return fail(errc::out_of_range, "unknown size unit in '" + std::string(text) + "'");
    }
    ++next;
    if (next != end && (*next == 'i' || *next == 'I')) ++next;
    if (next != end && (*next == 'b' || *next == 'B')) ++next;
    if (next != end) return fail(errc::out_of_range, "trailing characters in '" + std::string(text) + "'");
  }
  if (value > UINT64_MAX / unit) return fail(errc::out_of_range, "size overflows: '" + std::string(text) + "'");
  return value * unit;
}

std::string format_size(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

}  // namespace corma::cli
