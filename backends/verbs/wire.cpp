#include "wire.hpp"

#include "wire/checksum.hpp"
#include "wire/codec.hpp"

namespace corma::verbs::wire {
namespace {

using corma::wire::Reader;
using corma::wire::Writer;

// The key record grew an access field in version 2 ("CVK2"); the endpoint
// record is still version 1.
constexpr std::uint32_t key_magic = 0x324b5643;       // "CVK2"
constexpr std::uint8_t key_version = 2;
constexpr std::size_t key_size = 34;
constexpr std::uint32_t endpoint_magic = 0x31505643;  // "CVP1"
constexpr std::uint8_t endpoint_version = 1;
constexpr std::uint32_t max_24_bits = (1U << 24) - 1;
constexpr std::uint32_t notify_magic = 0x314e5643;  // "CVN1"
constexpr std::uint32_t ack_magic = 0x31525643;     // "CVR1"
constexpr std::uint8_t message_version = 1;

/// The accesses a packed key may carry: those that expose the range.
bool exposed_access(std::uint8_t value) {
  return value == static_cast<std::uint8_t>(Access::remote_read) ||
         value == static_cast<std::uint8_t>(Access::remote_read_write) ||
         value == static_cast<std::uint8_t>(Access::remote_atomic);
}

Result<RemoteKey> read_key(const PackedKey& key) {
  Reader in(key);
  CORMA_TRY(auto magic, in.u32("magic"));
  if (magic != key_magic) return fail(errc::invalid_key, "not a verbs packed key");
  CORMA_TRY(auto v, in.u8("version"));
  if (v != key_version) return fail(errc::invalid_key, "unknown verbs packed key version");
  RemoteKey out;
  CORMA_TRY(out.rkey, in.u32("rkey"));
  CORMA_TRY(out.addr, in.u64("addr"));
  CORMA_TRY(out.len, in.u64("len"));
  CORMA_TRY(auto access, in.u8("access"));
  const auto covered = std::span(key).first(in.position());
  CORMA_TRY(auto sum, in.u64("checksum"));
  CORMA_TRY(in.expect_end("verbs packed key"));
  if (sum != corma::wire::fnv1a(covered)) return fail(errc::invalid_key, "packed key checksum mismatch");
  if (out.len == 0 || out.addr + out.len < out.addr) {
    return fail(errc::invalid_key, "packed key describes an impossible range");
  }
  if (!exposed_access(access)) return fail(errc::invalid_key, "packed key names no remote access");
  out.access = static_cast<Access>(access);
  return out;
}

Result<std::uint16_t> read_mtu(Reader& in) {
  CORMA_TRY(auto mtu, in.u16("mtu"));
  for (std::uint16_t known : {256, 512, 1024, 2048, 4096}) {
    if (mtu == known) return mtu;
  }
  return fail(errc::protocol, "peer blob names an unknown MTU");
}

Result<NotifyMessage> read_notify(Reader& in) {
  NotifyMessage out;
  CORMA_TRY(out.sequence, in.u64("sequence"));
  CORMA_TRY(out.tag, in.u64("tag"));
  return out;
}

Result<AckMessage> read_ack(Reader& in) {
  AckMessage out;
  CORMA_TRY(out.sequence, in.u64("sequence"));
  CORMA_TRY(auto status, in.u8("status"));
  if (status > static_cast<std::uint8_t>(NotifyStatus::shutting_down)) {
    return fail(errc::protocol, "acknowledgement with an unknown status");
  }
  out.status = static_cast<NotifyStatus>(status);
  return out;
}

}  // namespace

PackedKey encode_key(const RemoteKey& key) {
  Writer out(key_size);
  out.u32(key_magic);
  out.u8(key_version);
  out.u32(key.rkey);
  out.u64(key.addr);
  out.u64(key.len);
  out.u8(static_cast<std::uint8_t>(key.access));
  auto bytes = std::move(out).take();
  // Catches corruption before the NIC does (which would break the connection).
  Writer sum;
  sum.u64(corma::wire::fnv1a(bytes));
  auto tail = std::move(sum).take();
  bytes.insert(bytes.end(), tail.begin(), tail.end());
  return bytes;
}

Result<RemoteKey> decode_key(const PackedKey& key) {
  if (key.empty()) return fail(errc::invalid_key, "empty packed key");
  if (key.size() > max_packed_key_size) return fail(errc::invalid_key, "oversized packed key");
  auto decoded = read_key(key);
  if (!decoded && !decoded.error().is(errc::invalid_key)) {
    return fail(errc::invalid_key, "malformed verbs packed key: " + decoded.error().detail);
  }
  return decoded;
}

std::vector<std::byte> encode_endpoint(const QpEndpoint& endpoint) {
  Writer out(36);
  out.u32(endpoint_magic);
  out.u8(endpoint_version);
  out.u32(endpoint.qp_num);
  out.u32(endpoint.psn);
  out.u16(endpoint.lid);
  out.u8(endpoint.has_gid ? 1 : 0);
  for (auto b : endpoint.gid) out.u8(b);
  out.u16(endpoint.mtu);
  return std::move(out).take();
}

Result<QpEndpoint> decode_endpoint(const std::vector<std::byte>& blob) {
  if (blob.size() > max_peer_blob_size) return fail(errc::protocol, "oversized peer blob");
  Reader in(blob);
  CORMA_TRY(auto magic, in.u32("magic"));
  if (magic != endpoint_magic) return fail(errc::protocol, "not a verbs peer blob");
  CORMA_TRY(auto v, in.u8("version"));
  if (v != endpoint_version) return fail(errc::protocol, "unknown verbs peer blob version");
  QpEndpoint out;
  CORMA_TRY(out.qp_num, in.u32("qp_num"));
  CORMA_TRY(out.psn, in.u32("psn"));
  CORMA_TRY(out.lid, in.u16("lid"));
  CORMA_TRY(auto has_gid, in.u8("has_gid"));
  if (has_gid > 1) return fail(errc::protocol, "peer blob has a malformed GID flag");
  out.has_gid = has_gid == 1;
  for (auto& b : out.gid) {
    CORMA_TRY(b, in.u8("gid"));
  }
  CORMA_TRY(out.mtu, read_mtu(in));
  CORMA_TRY(in.expect_end("verbs peer blob"));
  if (out.qp_num > max_24_bits || out.psn > max_24_bits) {
    return fail(errc::protocol, "peer blob has a queue pair number or PSN wider than 24 bits");
  }
  return out;
}

std::vector<std::byte> encode_message(const Message& message) {
  Writer out(notify_message_size);
  if (const auto* notify = std::get_if<NotifyMessage>(&message)) {
    out.u32(notify_magic);
    out.u8(message_version);
    out.u64(notify->sequence);
    out.u64(notify->tag);
  } else {
    const auto& ack = std::get<AckMessage>(message);
    out.u32(ack_magic);
    out.u8(message_version);
    out.u64(ack.sequence);
    out.u8(static_cast<std::uint8_t>(ack.status));
  }
  return std::move(out).take();
}

Result<Message> decode_message(std::span<const std::byte> bytes) {
  // Sizes first: a record of the wrong length is not looked into.
  if (bytes.size() != notify_message_size && bytes.size() != ack_message_size) {
    return fail(errc::protocol, "a verbs message of " + std::to_string(bytes.size()) + " bytes");
  }
  Reader in(bytes);
  CORMA_TRY(auto magic, in.u32("magic"));
  const bool notify = magic == notify_magic && bytes.size() == notify_message_size;
  const bool ack = magic == ack_magic && bytes.size() == ack_message_size;
  if (!notify && !ack) return fail(errc::protocol, "not a verbs notification or acknowledgement");
  CORMA_TRY(auto v, in.u8("version"));
  if (v != message_version) return fail(errc::protocol, "unknown verbs message version");
  Message out;
  if (notify) {
    CORMA_TRY(out, read_notify(in));
  } else {
    CORMA_TRY(out, read_ack(in));
  }
  CORMA_TRY(in.expect_end("verbs message"));
  return out;
}

}  // namespace corma::verbs::wire
