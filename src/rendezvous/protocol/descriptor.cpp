#include <corma/descriptor.hpp>

#include "wire/codec.hpp"

#include <string>

namespace corma {
namespace {

using wire::Reader;
using wire::Writer;

Result<void> check_key_size(std::size_t size) {
  if (size == 0) return fail(errc::invalid_key, "empty packed key");
  if (size > max_packed_key_size) {
    return fail(errc::invalid_key, "packed key of " + std::to_string(size) + " bytes exceeds " +
                                       std::to_string(max_packed_key_size));
  }
  return success();
}

}  // namespace

std::vector<std::byte> encode(const RemoteRegion& descriptor) {
  Writer out(descriptor_header_size + descriptor.packed_key.size());
  out.u8(descriptor_version);
  out.u8(static_cast<std::uint8_t>(descriptor.backend));
  out.u16(0);  // flags
  out.u64(descriptor.generation);
  out.u64(descriptor.addr);
  out.u64(descriptor.len);
  out.u32(wire::checked_length<std::uint32_t>(descriptor.packed_key.size(), "packed key"));
  out.bytes(descriptor.packed_key);
  return std::move(out).take();
}

Result<RemoteRegion> decode_descriptor(std::span<const std::byte> bytes) {
  Reader in(bytes);
  RemoteRegion d;

  CORMA_TRY(auto version, in.u8("descriptor version"));
  if (version != descriptor_version) {
    return fail(errc::protocol, "unknown descriptor version " + std::to_string(version));
  }
  CORMA_TRY(auto backend, in.u8("descriptor backend"));
  if (backend == 0) return fail(errc::protocol, "descriptor names no backend");
  d.backend = BackendId{backend};
  CORMA_TRY(auto flags, in.u16("descriptor flags"));
  if (flags != 0) return fail(errc::protocol, "reserved descriptor flags " + std::to_string(flags) + " set");
  CORMA_TRY(d.generation, in.u64("descriptor generation"));
  CORMA_TRY(d.addr, in.u64("descriptor address"));
  CORMA_TRY(d.len, in.u64("descriptor length"));
  if (d.len == 0) return fail(errc::protocol, "descriptor of zero length");
  CORMA_TRY(auto key_len, in.u32("descriptor packed-key length"));
  CORMA_TRY(check_key_size(key_len));
  if (key_len != in.remaining()) {
    return fail(errc::protocol, "descriptor packed-key length " + std::to_string(key_len) +
                                    " disagrees with the " + std::to_string(in.remaining()) +
                                    " bytes that follow");
  }
  CORMA_TRY(d.packed_key, in.byte_vector(key_len, "descriptor packed key"));
  CORMA_TRY(in.expect_end("the descriptor"));
  return d;
}

Result<std::vector<std::byte>> describe(const RemoteRegion& region) {
  if (region.backend == BackendId::none) return fail(errc::not_configured, "region names no backend");
  // Refuse here what every consumer would refuse on the wire.
  if (region.len == 0) return fail(errc::out_of_range, "region of zero length");
  CORMA_TRY(check_key_size(region.packed_key.size()));
  return encode(region);
}

}  // namespace corma
