#include "wire.hpp"

#include "wire/checksum.hpp"
#include "wire/codec.hpp"

#include <bit>
#include <cstring>

namespace corma::ucx::wire {
namespace {

using corma::wire::Reader;
using corma::wire::Writer;

constexpr std::uint32_t key_magic = 0x324b5543;      // "CUK2" in memory order
constexpr std::uint32_t old_address_magic = 0x31415543;  // "CUA1": answers before notifications
constexpr std::uint32_t address_magic = 0x32415543;      // "CUA2" in memory order
constexpr std::uint32_t offer_magic = 0x314f5543;    // "CUO1" in memory order
constexpr std::uint8_t offer_version = 1;
constexpr std::size_t offer_size = 5;                // magic, version
constexpr std::size_t key_header = 40;               // magic, rkey length, addr, len, access, checksum
constexpr std::size_t address_header = 16;           // magic, length, notification token
constexpr std::size_t padding = 4096;
constexpr std::size_t min_rkey = 9;                  // md_map + memory type

/// Over the record's covered fields (addr, len and access, little-endian, as
/// they lie in the key) and then the rkey.
std::uint64_t checksum(std::span<const std::byte> range_fields, std::span<const std::byte> rkey) {
  return corma::wire::fnv1a(rkey, corma::wire::fnv1a(range_fields));
}

std::vector<std::byte> padded_copy(std::span<const std::byte> bytes) {
  std::vector<std::byte> copy(bytes.size() + padding, std::byte{0});
  std::memcpy(copy.data(), bytes.data(), bytes.size());
  return copy;
}

bool exposed_access(std::uint64_t value) {
  return value == static_cast<std::uint64_t>(Access::remote_read) ||
         value == static_cast<std::uint64_t>(Access::remote_read_write) ||
         value == static_cast<std::uint64_t>(Access::remote_atomic);
}

}  // namespace

PackedKey encode_key(std::uint64_t addr, std::uint64_t len, Access access, std::span<const std::byte> rkey) {
  Writer range(24);
  range.u64(addr);
  range.u64(len);
  range.u64(static_cast<std::uint64_t>(access));
  const auto range_fields = std::move(range).take();

  Writer out(key_header + rkey.size());
  out.u32(key_magic);
  out.u32(corma::wire::checked_length<std::uint32_t>(rkey.size(), "UCX rkey"));
  out.bytes(range_fields);
  out.u64(checksum(range_fields, rkey));
  out.bytes(rkey);
  return std::move(out).take();
}

Result<std::uint64_t> check_rkey_structure(std::span<const std::byte> rkey) {
  // UCX writes md_map in host order; UCX runs only on little-endian hosts.
  Reader in(rkey);
  auto md_map_read = in.u64("UCX rkey md_map");
  auto memory_type = in.u8("UCX rkey memory type");
  if (!md_map_read || !memory_type) return fail(errc::invalid_key, "UCX rkey is too short");
  const auto md_map = md_map_read.value();
  if (md_map == 0) return fail(errc::invalid_key, "UCX rkey names no memory domain");
  if (memory_type.value() != 0) return fail(errc::invalid_key, "UCX rkey is not for host memory");
  for (int i = 0; i < std::popcount(md_map); ++i) {
    auto size = in.u8("UCX rkey record size");
    if (!size || !in.bytes(size.value(), "UCX rkey record")) {
      return fail(errc::invalid_key, "UCX rkey is truncated");
    }
  }
  if (in.remaining() != 0) return fail(errc::invalid_key, "UCX rkey length disagrees with its records");
  return md_map;
}

Result<RemoteKey> decode_key(const PackedKey& key, std::uint64_t local_md_map) {
  if (key.empty()) return fail(errc::invalid_key, "empty packed key");
  if (key.size() > max_packed_key_size) return fail(errc::invalid_key, "oversized packed key");
  if (key.size() < key_header + min_rkey) return fail(errc::invalid_key, "truncated packed key");
  // The size check above makes every header read succeed.
  Reader in(key);
  RemoteKey remote;
  CORMA_TRY(auto magic, in.u32("magic"));
  CORMA_TRY(auto rkey_size, in.u32("rkey length"));
  CORMA_TRY(remote.addr, in.u64("addr"));
  CORMA_TRY(remote.len, in.u64("len"));
  CORMA_TRY(auto access, in.u64("access"));
  CORMA_TRY(auto sum, in.u64("checksum"));
  if (magic != key_magic) return fail(errc::invalid_key, "not a UCX packed key");
  if (rkey_size != in.remaining()) {
    return fail(errc::invalid_key, "packed key length disagrees with its bytes");
  }
  const auto rkey = std::span<const std::byte>(key).subspan(key_header);
  if (sum != checksum(std::span<const std::byte>(key).subspan(8, 24), rkey)) {
    return fail(errc::invalid_key, "packed key checksum mismatch");
  }
  if (!exposed_access(access)) return fail(errc::invalid_key, "packed key names no remote access");
  remote.access = static_cast<Access>(access);
  if (remote.len == 0 || remote.addr + remote.len < remote.addr) {
    return fail(errc::invalid_key, "packed key describes an impossible range");
  }
  CORMA_TRY(remote.md_map, check_rkey_structure(rkey));
  if ((remote.md_map & ~local_md_map) != 0) {
    return fail(errc::invalid_key, "packed key names memory domains this worker does not have");
  }
  remote.rkey = padded_copy(rkey);
  remote.rkey_size = rkey.size();
  return remote;
}

std::vector<std::byte> encode_offer() {
  Writer out(offer_size);
  out.u32(offer_magic);
  out.u8(offer_version);
  return std::move(out).take();
}

Result<void> decode_offer(const std::vector<std::byte>& blob) {
  if (blob.size() > max_peer_blob_size) return fail(errc::protocol, "oversized peer offer");
  Reader in(blob);
  auto magic = in.u32("peer offer magic");
  if (!magic) return fail(errc::protocol, "truncated peer offer");
  if (magic.value() == address_magic || magic.value() == old_address_magic) {
    return fail(errc::protocol, "peer offer carries a worker address: this side does not connect to its readers");
  }
  if (magic.value() != offer_magic) return fail(errc::protocol, "not a UCX peer offer");
  auto version = in.u8("peer offer version");
  if (!version) return fail(errc::protocol, "truncated peer offer");
  if (version.value() != offer_version) return fail(errc::protocol, "unsupported UCX peer offer version");
  if (in.remaining() != 0) return fail(errc::protocol, "trailing bytes after the UCX peer offer");
  return success();
}

std::vector<std::byte> encode_address(std::uint64_t token, std::span<const std::byte> address) {
  Writer out(address_header + address.size());
  out.u32(address_magic);
  out.u32(corma::wire::checked_length<std::uint32_t>(address.size(), "UCX worker address"));
  out.u64(token);
  out.bytes(address);
  return std::move(out).take();
}

Result<PeerAddress> decode_address(const std::vector<std::byte>& blob) {
  if (blob.size() > max_peer_blob_size) return fail(errc::protocol, "oversized peer blob");
  if (blob.size() <= address_header) return fail(errc::protocol, "truncated peer blob");
  Reader in(blob);
  CORMA_TRY(auto magic, in.u32("peer blob magic"));
  if (magic != address_magic) return fail(errc::protocol, "not a UCX peer blob");
  CORMA_TRY(auto length, in.u32("peer blob length"));
  CORMA_TRY(auto token, in.u64("notification token"));
  if (length != in.remaining()) return fail(errc::protocol, "peer blob length disagrees with its bytes");
  return PeerAddress{token, padded_copy(std::span(blob).subspan(address_header))};
}

std::vector<std::byte> encode_notify(const NotifyHeader& header) {
  Writer out(24);
  out.u64(header.token);
  out.u64(header.tag);
  out.u64(header.sequence);
  return std::move(out).take();
}

Result<NotifyHeader> decode_notify(std::span<const std::byte> bytes) {
  if (bytes.size() != 24) return fail(errc::protocol, "a notification header is 24 bytes");
  Reader in(bytes);
  NotifyHeader header;
  CORMA_TRY(header.token, in.u64("notification token"));
  CORMA_TRY(header.tag, in.u64("notification tag"));
  CORMA_TRY(header.sequence, in.u64("notification sequence"));
  return header;
}

std::vector<std::byte> encode_ack(const NotifyAck& ack) {
  Writer out(16);
  out.u64(ack.sequence);
  out.u64(ack.status);
  return std::move(out).take();
}

Result<NotifyAck> decode_ack(std::span<const std::byte> bytes) {
  if (bytes.size() != 16) return fail(errc::protocol, "a notification acknowledgement is 16 bytes");
  Reader in(bytes);
  NotifyAck ack;
  CORMA_TRY(ack.sequence, in.u64("acknowledged sequence"));
  CORMA_TRY(ack.status, in.u64("acknowledgement status"));
  if (ack.status > static_cast<std::uint64_t>(NotifyStatus::shutting_down)) {
    return fail(errc::protocol, "unknown acknowledgement status");
  }
  return ack;
}

}  // namespace corma::ucx::wire
