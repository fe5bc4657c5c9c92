// Little-endian, fixed-width, unpadded encoding shared by every corma wire
// record (rendezvous frames and descriptors, each backend's keys and peer
// blobs): a byte writer and a bounds-checked reader whose every read returns
// a Result. Header-only: it needs nothing but corma's error type.
#pragma once

#include <corma/error.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace corma::wire {

/// Appends fields to a byte buffer. Writing never fails; a length that does
/// not fit the width of its field is a caller bug and throws std::length_error
/// (see checked_length).
class Writer {
 public:
  Writer() = default;
  explicit Writer(std::size_t reserve) { out_.reserve(reserve); }

  void u8(std::uint8_t value) { out_.push_back(static_cast<std::byte>(value)); }
  void u16(std::uint16_t value) { put(value); }
  void u32(std::uint32_t value) { put(value); }
  void u64(std::uint64_t value) { put(value); }
  void bytes(std::span<const std::byte> value) { out_.insert(out_.end(), value.begin(), value.end()); }
  void text(std::string_view value) {
    bytes(std::span{reinterpret_cast<const std::byte*>(value.data()), value.size()});
  }

  /// Overwrites a u32 written earlier at `offset` (length prefixes).
  void patch_u32(std::size_t offset, std::uint32_t value) {
    if (offset > out_.size() || out_.size() - offset < 4) {
      throw std::out_of_range("wire::Writer::patch_u32 past the end");
    }
    for (std::size_t i = 0; i < 4; ++i) {
      out_[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xffU);
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return out_.size(); }
  [[nodiscard]] std::vector<std::byte> take() && { return std::move(out_); }

 private:
  template <class T>
  void put(T value) {
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out_.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xffU));
    }
  }

  std::vector<std::byte> out_;
};

[[noreturn]] inline void throw_length_error(const char* what, std::size_t size) {
  throw std::length_error(std::string("corma: ") + what + " of " + std::to_string(size) +
                          " bytes does not fit its length field");
}

/// `size` as a length field of type T; throws std::length_error when it does
/// not fit (`what` names the field).
template <class T>
[[nodiscard]] T checked_length(std::size_t size, const char* what) {
  if (size > std::numeric_limits<T>::max()) throw_length_error(what, size);
  return static_cast<T>(size);
}

/// Reads fields from a byte span. Every read names its field: running past
/// the end fails with `protocol` and a detail saying which field and by how
/// much, and leaves the reader where it was.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}

  [[nodiscard]] Result<std::uint8_t> u8(std::string_view field) { return get<std::uint8_t>(field); }
  [[nodiscard]] Result<std::uint16_t> u16(std::string_view field) { return get<std::uint16_t>(field); }
  [[nodiscard]] Result<std::uint32_t> u32(std::string_view field) { return get<std::uint32_t>(field); }
  [[nodiscard]] Result<std::uint64_t> u64(std::string_view field) { return get<std::uint64_t>(field); }

  /// The next `n` bytes, as a view into the input.
  [[nodiscard]] Result<std::span<const std::byte>> bytes(std::size_t n, std::string_view field) {
    CORMA_TRY(need(n, field));
    auto view = bytes_.subspan(at_, n);
    at_ += n;
    return view;
  }
  [[nodiscard]] Result<std::vector<std::byte>> byte_vector(std::size_t n, std::string_view field) {
    CORMA_TRY(auto view, bytes(n, field));
    return std::vector<std::byte>(view.begin(), view.end());
  }
  [[nodiscard]] Result<std::string> text(std::size_t n, std::string_view field) {
    CORMA_TRY(auto view, bytes(n, field));
    return std::string(reinterpret_cast<const char*>(view.data()), view.size());
  }

  /// Fails with `protocol` unless everything was consumed (`what` names the
  /// record, for the detail).
  [[nodiscard]] Result<void> expect_end(std::string_view what) const {
    if (remaining() != 0) {
      return fail(errc::protocol, std::to_string(remaining()) + " trailing bytes after " + std::string(what));
    }
    return success();
  }

  [[nodiscard]] std::size_t remaining() const noexcept { return bytes_.size() - at_; }
  [[nodiscard]] std::size_t position() const noexcept { return at_; }

 private:
  [[nodiscard]] Result<void> need(std::size_t n, std::string_view field) const {
    if (n > remaining()) {
      return fail(errc::protocol, "truncated " + std::string(field) + ": needs " + std::to_string(n) +
                                      " bytes at offset " + std::to_string(at_) + ", " +
                                      std::to_string(remaining()) + " left");
    }
    return success();
  }

  template <class T>
  [[nodiscard]] Result<T> get(std::string_view field) {
    CORMA_TRY(need(sizeof(T), field));
    T value = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      value = static_cast<T>(value | static_cast<T>(static_cast<T>(bytes_[at_ + i]) << (8 * i)));
    }
    at_ += sizeof(T);
    return value;
  }

  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

}  // namespace corma::wire
