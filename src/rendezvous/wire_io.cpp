#include "wire_io.hpp"

#include <stdexcept>

namespace corma::rendezvous::wire {

void Writer::patch_u32(std::size_t offset, std::uint32_t value) {
  if (offset > out_.size() || out_.size() - offset < 4) {
    throw std::out_of_range("wire::Writer::patch_u32 past the end");
  }
  for (std::size_t i = 0; i < 4; ++i) {
    out_[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xffU);
  }
}

void throw_length_error(const char* what, std::size_t size) {
  throw std::length_error(std::string("corma: ") + what + " of " + std::to_string(size) +
                          " bytes does not fit its length field");
}

Result<void> Reader::need(std::size_t n, std::string_view field) const {
  if (n > remaining()) {
    return fail(errc::protocol, "truncated " + std::string(field) + ": needs " + std::to_string(n) +
                                    " bytes at offset " + std::to_string(at_) + ", " +
                                    std::to_string(remaining()) + " left");
  }
  return success();
}

Result<std::span<const std::byte>> Reader::bytes(std::size_t n, std::string_view field) {
  CORMA_TRY(need(n, field));
  auto view = bytes_.subspan(at_, n);
  at_ += n;
  return view;
}

Result<std::vector<std::byte>> Reader::byte_vector(std::size_t n, std::string_view field) {
  CORMA_TRY(auto view, bytes(n, field));
  return std::vector<std::byte>(view.begin(), view.end());
}

Result<std::string> Reader::text(std::size_t n, std::string_view field) {
  CORMA_TRY(auto view, bytes(n, field));
  return std::string(reinterpret_cast<const char*>(view.data()), view.size());
}

Result<void> Reader::expect_end(std::string_view what) const {
  if (remaining() != 0) {
    return fail(errc::protocol, std::to_string(remaining()) + " trailing bytes after " + std::string(what));
  }
  return success();
}

}  // namespace corma::rendezvous::wire
