#include "wire.hpp"

#include "backend_kit/fnv1a.hpp"

#include <bit>
#include <cstring>

namespace corma::ucx::wire {
namespace {

constexpr std::uint32_t key_magic = 0x314b5543;      // "CUK1"
constexpr std::uint32_t address_magic = 0x31415543;  // "CUA1"
constexpr std::size_t key_header = 32;               // magic, rkey length, addr, len, checksum
constexpr std::size_t address_header = 8;            // magic, length
constexpr std::size_t padding = 4096;
constexpr std::size_t min_rkey = 9;                  // md_map + memory type

template <class T>
void put(std::vector<std::byte>& out, T value) {
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), p, p + sizeof value);
}

template <class T>
T get(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

/// Over the record's range fields (as they lie in the key) and the rkey.
std::uint64_t checksum(std::span<const std::byte> range_fields, std::span<const std::byte> rkey) {
  return backend_kit::fnv1a(rkey, backend_kit::fnv1a(range_fields));
}

std::vector<std::byte> padded_copy(std::span<const std::byte> bytes) {
  std::vector<std::byte> copy(bytes.size() + padding, std::byte{0});
  std::memcpy(copy.data(), bytes.data(), bytes.size());
  return copy;
}

}  // namespace

PackedKey encode_key(std::uint64_t addr, std::uint64_t len, std::span<const std::byte> rkey) {
  PackedKey key;
  key.reserve(key_header + rkey.size());
  put(key, key_magic);
  put(key, static_cast<std::uint32_t>(rkey.size()));
  put(key, addr);
  put(key, len);
  put(key, checksum(std::span(key).subspan(8, 16), rkey));
  key.insert(key.end(), rkey.begin(), rkey.end());
  return key;
}

Result<std::uint64_t> check_rkey_structure(std::span<const std::byte> rkey) {
  if (rkey.size() < min_rkey) return fail(errc::invalid_key, "UCX rkey is too short");
  const auto md_map = get<std::uint64_t>(rkey.data());
  if (md_map == 0) return fail(errc::invalid_key, "UCX rkey names no memory domain");
  if (rkey[8] != std::byte{0}) return fail(errc::invalid_key, "UCX rkey is not for host memory");
  std::size_t at = min_rkey;
  for (int i = 0; i < std::popcount(md_map); ++i) {
    if (at >= rkey.size()) return fail(errc::invalid_key, "UCX rkey is truncated");
    at += 1 + static_cast<std::size_t>(rkey[at]);
  }
  if (at != rkey.size()) return fail(errc::invalid_key, "UCX rkey length disagrees with its records");
  return md_map;
}

Result<RemoteKey> decode_key(const PackedKey& key, std::uint64_t local_md_map) {
  if (key.empty()) return fail(errc::invalid_key, "empty packed key");
  if (key.size() > max_packed_key_size) return fail(errc::invalid_key, "oversized packed key");
  if (key.size() < key_header + min_rkey) return fail(errc::invalid_key, "truncated packed key");
  if (get<std::uint32_t>(key.data()) != key_magic) return fail(errc::invalid_key, "not a UCX packed key");
  const auto rkey_size = get<std::uint32_t>(key.data() + 4);
  if (rkey_size != key.size() - key_header) {
    return fail(errc::invalid_key, "packed key length disagrees with its bytes");
  }
  RemoteKey remote;
  remote.addr = get<std::uint64_t>(key.data() + 8);
  remote.len = get<std::uint64_t>(key.data() + 16);
  const std::span<const std::byte> rkey(key.data() + key_header, rkey_size);
  if (get<std::uint64_t>(key.data() + 24) != checksum(std::span(key).subspan(8, 16), rkey)) {
    return fail(errc::invalid_key, "packed key checksum mismatch");
  }
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

std::vector<std::byte> encode_address(std::span<const std::byte> address) {
  std::vector<std::byte> blob;
  blob.reserve(address_header + address.size());
  put(blob, address_magic);
  put(blob, static_cast<std::uint32_t>(address.size()));
  blob.insert(blob.end(), address.begin(), address.end());
  return blob;
}

Result<std::vector<std::byte>> decode_address(const std::vector<std::byte>& blob) {
  if (blob.size() > max_peer_blob_size) return fail(errc::protocol, "oversized peer blob");
  if (blob.size() <= address_header) return fail(errc::protocol, "truncated peer blob");
  if (get<std::uint32_t>(blob.data()) != address_magic) return fail(errc::protocol, "not a UCX peer blob");
  if (get<std::uint32_t>(blob.data() + 4) != blob.size() - address_header) {
    return fail(errc::protocol, "peer blob length disagrees with its bytes");
  }
  return padded_copy(std::span(blob).subspan(address_header));
}

}  // namespace corma::ucx::wire
