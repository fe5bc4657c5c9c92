// Small helpers every scenario file of the benchmark uses.
#pragma once

#include <corma/error.hpp>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace corma::bench {

using clock_type = std::chrono::steady_clock;

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;

/// "8B", "64KiB", "256MiB": the sizes in row names.
inline std::string size_name(std::size_t size) {
  if (size >= MiB) return std::to_string(size / MiB) + "MiB";
  if (size >= KiB) return std::to_string(size / KiB) + "KiB";
  return std::to_string(size) + "B";
}

/// The value, or an exception naming `what` (a benchmark has no error path).
template <class T>
T must(Result<T> r, const char* what) {
  if (!r) throw std::runtime_error(std::string(what) + ": " + r.error().message());
  return std::move(r).value();
}

}  // namespace corma::bench
