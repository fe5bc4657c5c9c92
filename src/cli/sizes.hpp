// Human byte sizes for the command line: "4096", "64K", "256M", "2G".
#pragma once

#include <corma/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace corma::cli {

[[nodiscard]] Result<std::uint64_t> parse_size(std::string_view text);
[[nodiscard]] std::string format_size(std::uint64_t bytes);

}  // namespace corma::cli
