#include "rendezvous/protocol/messages.hpp"

#include "wire/codec.hpp"

#include <algorithm>
#include <iterator>
#include <string>
#include <type_traits>

namespace corma::rendezvous {
namespace {

using wire::checked_length;
using wire::Reader;
using wire::Writer;

// ---- shared field codecs ---------------------------------------------------

/// u8 backend: a BackendId, 0 for none. Which ids exist is the backends'
/// business; an owner takes only an offer for its own backend.
void put_backend(Writer& out, BackendId backend) { out.u8(static_cast<std::uint8_t>(backend)); }

Result<BackendId> get_backend(Reader& in, std::string_view field) {
  CORMA_TRY(auto value, in.u8(field));
  return BackendId{value};
}

/// u32 length + bytes, the length at most `max`.
Result<std::vector<std::byte>> get_blob(Reader& in, std::string_view field, std::size_t max) {
  CORMA_TRY(auto len, in.u32(std::string(field) + " length"));
  if (len > max) {
    return fail(errc::protocol, std::string(field) + " of " + std::to_string(len) + " bytes exceeds " +
                                std::to_string(max));
  }
  return in.byte_vector(len, field);
}

/// u32 length + bytes.
void put_blob(Writer& out, const std::vector<std::byte>& blob, const char* what) {
  out.u32(checked_length<std::uint32_t>(blob.size(), what));
  out.bytes(blob);
}

// ---- payload encoders --------------------------------------------------------

void put_payload(Writer& out, const Hello& m) {
  out.u16(m.version);
  put_backend(out, m.backend);
  put_blob(out, m.peer_offer, "peer offer");
}

void put_payload(Writer& out, const HelloOk& m) {
  out.u16(m.version);
  put_backend(out, m.backend);
  put_blob(out, m.peer_answer, "peer answer");
  out.u32(m.max_frame_body);
  if (m.version >= batch_protocol_version) out.u16(m.max_batch);
}

void put_name(Writer& out, const std::string& name) {
  out.u16(checked_length<std::uint16_t>(name.size(), "object name"));
  out.text(name);
}

void put_payload(Writer& out, const Acquire& m) {
  put_name(out, m.name);
  out.u8(m.wants_rdma ? 1 : 0);
}

/// What an RDMA grant and a window share ahead of their own fields.
void put_lease_terms(Writer& out, std::uint64_t lease, std::uint64_t size, std::uint32_t lease_timeout_ms) {
  out.u64(lease);
  out.u64(size);
  out.u32(lease_timeout_ms);
}

void put_descriptor(Writer& out, const std::vector<std::byte>& descriptor) { put_blob(out, descriptor, "descriptor"); }

/// Version 5's generation, after a message's own fields: written only when
/// the message carries one (fit_to_version drops it for older sessions).
void put_generation(Writer& out, const Generation& generation) {
  if (generation) out.u64(*generation);
}

// An acquire answer's fields, without the generation: in `granted` the
// generations follow all the answers.
void put_fields(Writer& out, const RdmaGrant& m) {
  put_lease_terms(out, m.lease, m.size, m.lease_timeout_ms);
  put_descriptor(out, m.descriptor);
}

void put_fields(Writer& out, const RdmaWindow& m) {
  put_lease_terms(out, m.lease, m.size, m.lease_timeout_ms);
  out.u64(m.offset);
  out.u64(m.window_len);
  put_descriptor(out, m.descriptor);
}

void put_fields(Writer& out, const Chunked& m) {
  out.u64(m.lease);
  out.u64(m.size);
  out.u32(m.chunk_size);
  out.u32(m.lease_timeout_ms);
  out.u8(static_cast<std::uint8_t>(m.reason));
}

void put_payload(Writer& out, const RdmaGrant& m) {
  put_fields(out, m);
  put_generation(out, m.generation);
}

void put_payload(Writer& out, const RdmaWindow& m) {
  put_fields(out, m);
  put_generation(out, m.generation);
}

void put_payload(Writer& out, const NextWindow& m) {
  out.u64(m.lease);
  out.u64(m.offset);
}

void put_payload(Writer& out, const Chunked& m) {
  put_fields(out, m);
  put_generation(out, m.generation);
}

void put_payload(Writer&, const NotFound&) {}

void put_payload(Writer& out, const Pull& m) {
  out.u64(m.lease);
  out.u64(m.offset);
  out.u32(m.len);
}

/// A data message up to its bytes: what encode_data_head() and a Data
/// message's encoding share.
void put_data_fields(Writer& out, std::uint64_t offset, std::size_t len) {
  out.u64(offset);
  out.u32(checked_length<std::uint32_t>(len, "data chunk"));
}

void put_payload(Writer& out, const Data& m) {
  put_data_fields(out, m.offset, m.bytes.size());
  out.bytes(m.bytes);
}

void put_payload(Writer& out, const Renew& m) { out.u64(m.lease); }
void put_payload(Writer& out, const Renewed& m) { out.u32(m.lease_timeout_ms); }
void put_payload(Writer& out, const Release& m) { out.u64(m.lease); }
void put_payload(Writer&, const Released&) {}

void put_payload(Writer& out, const ErrorReply& m) {
  out.u16(m.code);
  out.u16(checked_length<std::uint16_t>(m.detail.size(), "error detail"));
  out.text(m.detail);
}

/// u16 count of a batch's elements (1..max_batch_objects: a caller bug otherwise).
void put_batch_count(Writer& out, std::size_t count, const char* what) {
  if (count == 0 || count > max_batch_objects) wire::throw_length_error(what, count);
  out.u16(static_cast<std::uint16_t>(count));
}

void put_payload(Writer& out, const AcquireMany& m) {
  put_batch_count(out, m.names.size(), "acquire_many names");
  out.u8(m.wants_rdma ? 1 : 0);
  for (const auto& name : m.names) put_name(out, name);
}

/// The message type each alternative of Grant travels as, in Grant's order.
constexpr MessageType grant_types[] = {MessageType::rdma_grant, MessageType::chunked, MessageType::not_found,
                                       MessageType::error, MessageType::rdma_window};
static_assert(std::size(grant_types) == std::variant_size_v<Grant>);

void put_fields(Writer& out, const NotFound& m) { put_payload(out, m); }
void put_fields(Writer& out, const ErrorReply& m) { put_payload(out, m); }

void put_payload(Writer& out, const Granted& m) {
  put_batch_count(out, m.grants.size(), "granted answers");
  bool generations = false;
  for (const auto& grant : m.grants) {
    out.u8(static_cast<std::uint8_t>(grant_types[grant.index()]));
    std::visit([&out](const auto& answer) { put_fields(out, answer); }, grant);
    generations = generations || grant_generation(grant).has_value();
  }
  // One per answer (0 for not_found and error) when any answer has one.
  if (generations) {
    for (const auto& grant : m.grants) out.u64(grant_generation(grant).value_or(0));
  }
}

void put_payload(Writer& out, const ReleaseMany& m) {
  put_batch_count(out, m.leases.size(), "release_many leases");
  for (auto lease : m.leases) out.u64(lease);
}

void put_payload(Writer& out, const ReleasedMany& m) {
  put_batch_count(out, m.codes.size(), "released_many codes");
  for (auto code : m.codes) out.u16(code);
}

void put_payload(Writer&, const PushOpen&) {}
void put_payload(Writer&, const PushReady&) {}

void put_payload(Writer& out, const PushOffer& m) { put_blob(out, m.peer_offer, "push peer offer"); }
void put_payload(Writer& out, const PushConnect& m) { put_blob(out, m.peer_answer, "push peer answer"); }

void put_payload(Writer& out, const Push& m) {
  put_name(out, m.name);
  out.u8(m.notify ? 1 : 0);
  out.u64(m.tag);
  put_descriptor(out, m.landing);
}

void put_payload(Writer& out, const Pushed& m) {
  out.u64(m.size);
  put_generation(out, m.generation);
}

void put_payload(Writer& out, const Prove& m) { out.bytes(m.challenge); }

void put_payload(Writer& out, const Proof& m) {
  out.u8(checked_length<std::uint8_t>(m.owner_id.size(), "proof owner id"));
  out.text(m.owner_id);
  out.bytes(m.mac);
}

void put_payload(Writer&, const Heartbeat&) {}

void put_payload(Writer& out, const HeartbeatOk& m) {
  out.u32(m.leases);
  out.u32(m.lease_timeout_ms);
}

// ---- payload decoders --------------------------------------------------------

Result<Hello> get_hello(Reader& in) {
  Hello m;
  CORMA_TRY(m.version, in.u16("hello version"));
  CORMA_TRY(m.backend, get_backend(in, "hello backend"));
  CORMA_TRY(m.peer_offer, get_blob(in, "hello peer offer", max_peer_blob_size));
  if (m.backend == BackendId::none && !m.peer_offer.empty()) {
    return fail(errc::protocol, "hello carries a peer offer of " + std::to_string(m.peer_offer.size()) +
                                " bytes but names no backend");
  }
  return m;
}

Result<HelloOk> get_hello_ok(Reader& in) {
  HelloOk m;
  CORMA_TRY(m.version, in.u16("hello_ok version"));
  CORMA_TRY(m.backend, get_backend(in, "hello_ok backend"));
  CORMA_TRY(m.peer_answer, get_blob(in, "hello_ok peer answer", max_peer_blob_size));
  if (m.backend == BackendId::none && !m.peer_answer.empty()) {
    return fail(errc::protocol, "hello_ok carries a peer answer of " + std::to_string(m.peer_answer.size()) +
                                " bytes but names no backend");
  }
  CORMA_TRY(m.max_frame_body, in.u32("hello_ok max frame body"));
  m.max_batch = 0;  // not on the wire before version 2
  if (m.version >= batch_protocol_version) {
    CORMA_TRY(m.max_batch, in.u16("hello_ok max batch"));
    if (m.max_batch == 0 || m.max_batch > max_batch_objects) {
      return fail(errc::protocol, "hello_ok max batch " + std::to_string(m.max_batch) + " is outside 1.." +
                                  std::to_string(max_batch_objects));
    }
  }
  return m;
}

/// u16 length + a non-empty object name of at most max_name_length bytes.
Result<std::string> get_name(Reader& in, std::string_view message) {
  const std::string field = std::string(message) + " name";
  CORMA_TRY(auto name_len, in.u16(field + " length"));
  if (name_len == 0) return fail(errc::protocol, std::string(message) + " with an empty object name");
  if (name_len > max_name_length) {
    return fail(errc::protocol, std::string(message) + " object name of " + std::to_string(name_len) +
                                " bytes exceeds " + std::to_string(max_name_length));
  }
  return in.text(name_len, field);
}

/// u8 0 or 1.
Result<bool> get_flag(Reader& in, std::string_view field) {
  CORMA_TRY(auto value, in.u8(field));
  if (value > 1) return fail(errc::protocol, std::string(field) + " is " + std::to_string(value) + ", not 0 or 1");
  return value == 1;
}

Result<Acquire> get_acquire(Reader& in) {
  Acquire m;
  CORMA_TRY(m.name, get_name(in, "acquire"));
  CORMA_TRY(m.wants_rdma, get_flag(in, "acquire wants_rdma"));
  return m;
}

/// u32 length + an encoded descriptor (1..its largest size; decoded by the reader).
Result<std::vector<std::byte>> get_descriptor(Reader& in, std::string_view message) {
  const std::string field = std::string(message) + " descriptor";
  CORMA_TRY(auto len, in.u32(field + " length"));
  constexpr std::size_t max_descriptor = descriptor_header_size + max_packed_key_size;
  if (len == 0 || len > max_descriptor) {
    return fail(errc::protocol, field + " of " + std::to_string(len) + " bytes is outside 1.." +
                                std::to_string(max_descriptor));
  }
  return in.byte_vector(len, field);
}

/// Version 5's generation after a frame's own fields: present when exactly
/// its 8 bytes are left (a frame's other trailing bytes stay malformed).
Result<Generation> get_generation(Reader& in) {
  if (in.remaining() != 8) return Generation{};
  CORMA_TRY(auto generation, in.u64("generation"));
  if (generation == 0) return fail(errc::protocol, "generation 0");
  return Generation{generation};
}

Result<RdmaGrant> get_rdma_grant_fields(Reader& in) {
  RdmaGrant m;
  CORMA_TRY(m.lease, in.u64("rdma_grant lease"));
  CORMA_TRY(m.size, in.u64("rdma_grant size"));
  CORMA_TRY(m.lease_timeout_ms, in.u32("rdma_grant lease timeout"));
  CORMA_TRY(m.descriptor, get_descriptor(in, "rdma_grant"));
  return m;
}

Result<RdmaWindow> get_rdma_window_fields(Reader& in) {
  RdmaWindow m;
  CORMA_TRY(m.lease, in.u64("rdma_window lease"));
  CORMA_TRY(m.size, in.u64("rdma_window size"));
  CORMA_TRY(m.lease_timeout_ms, in.u32("rdma_window lease timeout"));
  CORMA_TRY(m.offset, in.u64("rdma_window offset"));
  CORMA_TRY(m.window_len, in.u64("rdma_window length"));
  if (m.window_len == 0 || m.offset > m.size || m.window_len > m.size - m.offset) {
    return fail(errc::protocol, "rdma_window [" + std::to_string(m.offset) + ", +" + std::to_string(m.window_len) +
                                ") is empty or outside the object's " + std::to_string(m.size) + " bytes");
  }
  CORMA_TRY(m.descriptor, get_descriptor(in, "rdma_window"));
  return m;
}

/// A frame that is an acquire answer: its fields, then its generation.
template <class Answer>
Result<Answer> with_generation(Result<Answer> fields, Reader& in) {
  if (!fields) return fields;
  CORMA_TRY(fields.value().generation, get_generation(in));
  return fields;
}

Result<RdmaGrant> get_rdma_grant(Reader& in) { return with_generation(get_rdma_grant_fields(in), in); }
Result<RdmaWindow> get_rdma_window(Reader& in) { return with_generation(get_rdma_window_fields(in), in); }

Result<NextWindow> get_next_window(Reader& in) {
  NextWindow m;
  CORMA_TRY(m.lease, in.u64("next_window lease"));
  CORMA_TRY(m.offset, in.u64("next_window offset"));
  return m;
}

Result<Chunked> get_chunked_fields(Reader& in) {
  Chunked m;
  CORMA_TRY(m.lease, in.u64("chunked lease"));
  CORMA_TRY(m.size, in.u64("chunked size"));
  CORMA_TRY(m.chunk_size, in.u32("chunked chunk size"));
  if (m.chunk_size == 0) return fail(errc::protocol, "chunked with a zero chunk size");
  CORMA_TRY(m.lease_timeout_ms, in.u32("chunked lease timeout"));
  CORMA_TRY(auto reason, in.u8("chunked reason"));
  if (reason < static_cast<std::uint8_t>(ChunkedReason::budget) ||
      reason > static_cast<std::uint8_t>(last_wire_reason)) {
    return fail(errc::protocol, "unknown chunked reason " + std::to_string(reason));
  }
  m.reason = static_cast<ChunkedReason>(reason);
  return m;
}

Result<Chunked> get_chunked(Reader& in) { return with_generation(get_chunked_fields(in), in); }

Result<Pull> get_pull(Reader& in) {
  Pull m;
  CORMA_TRY(m.lease, in.u64("pull lease"));
  CORMA_TRY(m.offset, in.u64("pull offset"));
  CORMA_TRY(m.len, in.u32("pull length"));
  if (m.len == 0) return fail(errc::protocol, "pull of zero bytes");
  return m;
}

Result<Data> get_data(Reader& in) {
  Data m;
  CORMA_TRY(m.offset, in.u64("data offset"));
  CORMA_TRY(auto len, in.u32("data length"));
  if (len != in.remaining()) {
    return fail(errc::protocol, "data length " + std::to_string(len) + " disagrees with the " +
                                std::to_string(in.remaining()) + " bytes that follow");
  }
  CORMA_TRY(m.bytes, in.byte_vector(len, "data bytes"));
  return m;
}

Result<Renew> get_renew(Reader& in) {
  Renew m;
  CORMA_TRY(m.lease, in.u64("renew lease"));
  return m;
}

Result<Renewed> get_renewed(Reader& in) {
  Renewed m;
  CORMA_TRY(m.lease_timeout_ms, in.u32("renewed lease timeout"));
  return m;
}

Result<Release> get_release(Reader& in) {
  Release m;
  CORMA_TRY(m.lease, in.u64("release lease"));
  return m;
}

Result<ErrorReply> get_error(Reader& in) {
  ErrorReply m;
  CORMA_TRY(m.code, in.u16("error code"));
  CORMA_TRY(auto len, in.u16("error detail length"));
  if (len > max_detail_length) {
    return fail(errc::protocol, "error detail of " + std::to_string(len) + " bytes exceeds " +
                                std::to_string(max_detail_length));
  }
  CORMA_TRY(m.detail, in.text(len, "error detail"));
  return m;
}

/// u16 count of a batch's elements, 1..max_batch_objects.
Result<std::size_t> get_batch_count(Reader& in, std::string_view message) {
  CORMA_TRY(auto count, in.u16(std::string(message) + " count"));
  if (count == 0 || count > max_batch_objects) {
    return fail(errc::protocol, std::string(message) + " of " + std::to_string(count) + " elements is outside 1.." +
                                std::to_string(max_batch_objects));
  }
  return static_cast<std::size_t>(count);
}

Result<AcquireMany> get_acquire_many(Reader& in) {
  AcquireMany m;
  CORMA_TRY(auto count, get_batch_count(in, "acquire_many"));
  CORMA_TRY(m.wants_rdma, get_flag(in, "acquire_many wants_rdma"));
  m.names.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    CORMA_TRY(auto name, get_name(in, "acquire_many"));
    m.names.push_back(std::move(name));
  }
  return m;
}

Result<Grant> get_grant(Reader& in) {
  CORMA_TRY(auto type, in.u8("granted answer type"));
  switch (static_cast<MessageType>(type)) {
    case MessageType::rdma_grant: {
      CORMA_TRY(auto grant, get_rdma_grant_fields(in));
      return Grant{std::move(grant)};
    }
    case MessageType::chunked: {
      CORMA_TRY(auto chunked, get_chunked_fields(in));
      return Grant{chunked};
    }
    case MessageType::not_found: return Grant{NotFound{}};
    case MessageType::error: {
      CORMA_TRY(auto error, get_error(in));
      return Grant{std::move(error)};
    }
    case MessageType::rdma_window: {
      CORMA_TRY(auto window, get_rdma_window_fields(in));
      return Grant{std::move(window)};
    }
    default: return fail(errc::protocol, "granted answer of type " + std::to_string(type) + " is not an acquire answer");
  }
}

Result<Granted> get_granted(Reader& in) {
  Granted m;
  CORMA_TRY(auto count, get_batch_count(in, "granted"));
  m.grants.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    CORMA_TRY(auto grant, get_grant(in));
    m.grants.push_back(std::move(grant));
  }
  // Version 5: one generation per answer after them all, sent only when an
  // answer lends an object (the encoder's rule: otherwise the same frame
  // would have two encodings).
  if (in.remaining() != count * 8) return m;
  const bool any_lends = std::any_of(m.grants.begin(), m.grants.end(), [](const Grant& grant) {
    return std::holds_alternative<RdmaGrant>(grant) || std::holds_alternative<Chunked>(grant) ||
           std::holds_alternative<RdmaWindow>(grant);
  });
  if (!any_lends) return fail(errc::protocol, "granted carries generations but lends no object");
  for (auto& grant : m.grants) {
    CORMA_TRY(auto generation, in.u64("granted generation"));
    const bool lends = std::holds_alternative<RdmaGrant>(grant) || std::holds_alternative<Chunked>(grant) ||
                       std::holds_alternative<RdmaWindow>(grant);
    if (lends != (generation != 0)) {
      return fail(errc::protocol, "granted generation " + std::to_string(generation) + " for an answer that " +
                                      (lends ? "lends an object" : "lends nothing"));
    }
    std::visit(
        [generation](auto& answer) {
          if constexpr (requires { answer.generation; }) answer.generation = generation;
        },
        grant);
  }
  return m;
}

Result<ReleaseMany> get_release_many(Reader& in) {
  ReleaseMany m;
  CORMA_TRY(auto count, get_batch_count(in, "release_many"));
  m.leases.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    CORMA_TRY(auto lease, in.u64("release_many lease"));
    m.leases.push_back(lease);
  }
  return m;
}

Result<ReleasedMany> get_released_many(Reader& in) {
  ReleasedMany m;
  CORMA_TRY(auto count, get_batch_count(in, "released_many"));
  m.codes.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    CORMA_TRY(auto code, in.u16("released_many code"));
    m.codes.push_back(code);
  }
  return m;
}

/// Decodes one payload of type T and widens it to a Message.
template <class T>
Result<Message> widen(Result<T> decoded) {
  CORMA_TRY(auto value, std::move(decoded));
  return Message{std::in_place_type<T>, std::move(value)};
}

Result<PushOpen> get_push_open(Reader&) { return PushOpen{}; }
Result<PushReady> get_push_ready(Reader&) { return PushReady{}; }

/// A peer blob of 1..max_peer_blob_size bytes.
Result<std::vector<std::byte>> get_peer_blob(Reader& in, std::string_view field) {
  CORMA_TRY(auto blob, get_blob(in, field, max_peer_blob_size));
  if (blob.empty()) return fail(errc::protocol, std::string(field) + " is empty");
  return blob;
}

Result<PushOffer> get_push_offer(Reader& in) {
  PushOffer m;
  CORMA_TRY(m.peer_offer, get_peer_blob(in, "push_offer peer offer"));
  return m;
}

Result<PushConnect> get_push_connect(Reader& in) {
  PushConnect m;
  CORMA_TRY(m.peer_answer, get_peer_blob(in, "push_connect peer answer"));
  return m;
}

Result<Push> get_push(Reader& in) {
  Push m;
  CORMA_TRY(m.name, get_name(in, "push"));
  CORMA_TRY(m.notify, get_flag(in, "push notify"));
  CORMA_TRY(m.tag, in.u64("push tag"));
  // Only framed here: the owner checks the descriptor itself and answers a
  // malformed one with `protocol`, keeping the connection (docs/protocol.md).
  CORMA_TRY(m.landing, get_blob(in, "push landing descriptor", max_peer_blob_size));
  return m;
}

Result<Pushed> get_pushed(Reader& in) {
  Pushed m;
  CORMA_TRY(m.size, in.u64("pushed size"));
  CORMA_TRY(m.generation, get_generation(in));
  return m;
}

Result<HeartbeatOk> get_heartbeat_ok(Reader& in) {
  HeartbeatOk m;
  CORMA_TRY(m.leases, in.u32("heartbeat_ok leases"));
  CORMA_TRY(m.lease_timeout_ms, in.u32("heartbeat_ok lease timeout"));
  return m;
}

Result<Heartbeat> get_heartbeat(Reader&) { return Heartbeat{}; }

Result<Prove> get_prove(Reader& in) {
  Prove m;
  CORMA_TRY(auto challenge, in.bytes(proof_challenge_size, "prove challenge"));
  std::copy(challenge.begin(), challenge.end(), m.challenge.begin());
  return m;
}

Result<Proof> get_proof(Reader& in) {
  Proof m;
  CORMA_TRY(auto id_length, in.u8("proof owner id length"));
  if (id_length == 0) return fail(errc::protocol, "proof with an empty owner id");
  CORMA_TRY(m.owner_id, in.text(id_length, "proof owner id"));
  CORMA_TRY(auto mac, in.bytes(proof_mac_size, "proof mac"));
  std::copy(mac.begin(), mac.end(), m.mac.begin());
  return m;
}
Result<NotFound> get_not_found(Reader&) { return NotFound{}; }
Result<Released> get_released(Reader&) { return Released{}; }

Result<Message> get_payload(MessageType type, Reader& in) {
  switch (type) {
#define CORMA_MESSAGE_DECODER(value, name, Type) \
  case MessageType::name: return widen(get_##name(in));
    CORMA_RENDEZVOUS_MESSAGES(CORMA_MESSAGE_DECODER)
#undef CORMA_MESSAGE_DECODER
  }
  return fail(errc::protocol, "unknown message type " + std::to_string(static_cast<unsigned>(type)));
}

#define CORMA_MESSAGE_ENUMERATOR(value, name, Type) MessageType::name,
/// Each message type, in the order of the list (and of Message's alternatives).
constexpr MessageType types_in_order[] = {CORMA_RENDEZVOUS_MESSAGES(CORMA_MESSAGE_ENUMERATOR)};
#undef CORMA_MESSAGE_ENUMERATOR
static_assert(std::size(types_in_order) == std::variant_size_v<Message>);

bool known_type(std::uint8_t value) noexcept {
  for (auto type : types_in_order) {
    if (static_cast<std::uint8_t>(type) == value) return true;
  }
  return false;
}

}  // namespace

std::string_view type_name(MessageType type) noexcept {
  switch (type) {
#define CORMA_MESSAGE_NAME(value, name, Type) \
  case MessageType::name: return #name;
    CORMA_RENDEZVOUS_MESSAGES(CORMA_MESSAGE_NAME)
#undef CORMA_MESSAGE_NAME
  }
  return "unknown";
}


MessageType type_of(const Message& message) noexcept { return types_in_order[message.index()]; }

namespace {

/// An answer's generation field, for the answers that have one.
template <class Answer>
Generation generation_field(const Answer& answer) noexcept {
  if constexpr (requires { answer.generation; }) {
    return answer.generation;
  } else {
    return std::nullopt;
  }
}

}  // namespace

Generation grant_generation(const Grant& grant) noexcept {
  return std::visit([](const auto& answer) { return generation_field(answer); }, grant);
}

Generation generation_of(const Message& message) noexcept {
  return std::visit([](const auto& answer) { return generation_field(answer); }, message);
}

void fit_to_version(Message& message, std::uint16_t version) noexcept {
  if (version >= generation_protocol_version) return;
  auto drop = [](auto& m) {
    if constexpr (requires { m.generation; }) m.generation.reset();
  };
  if (auto* granted = std::get_if<Granted>(&message)) {
    for (auto& grant : granted->grants) std::visit(drop, grant);
    return;
  }
  std::visit(drop, message);
}

namespace {

void put_frame_header(Writer& out, MessageType type, std::uint64_t request_id) {
  out.u32(0);  // body length, patched once the body is known
  out.u8(static_cast<std::uint8_t>(type));
  out.u8(0);
  out.u16(0);
  out.u64(request_id);
}

}  // namespace

std::vector<std::byte> encode_frame(const Frame& frame) {
  Writer out(frame_header_size);
  put_frame_header(out, type_of(frame.message), frame.request_id);
  std::visit([&out](const auto& m) { put_payload(out, m); }, frame.message);
  out.patch_u32(0, checked_length<std::uint32_t>(out.size() - 4, "frame body"));
  return std::move(out).take();
}

std::vector<std::byte> encode_data_head(std::uint64_t request_id, std::uint64_t offset, std::size_t len) {
  Writer out(frame_header_size + 12);
  put_frame_header(out, MessageType::data, request_id);
  put_data_fields(out, offset, len);
  out.patch_u32(0, checked_length<std::uint32_t>(out.size() - 4 + len, "frame body"));
  return std::move(out).take();
}

Result<std::uint32_t> decode_frame_length(std::span<const std::byte> prefix, std::uint32_t max_body) {
  Reader in(prefix);
  CORMA_TRY(auto body, in.u32("frame length prefix"));
  if (body < frame_fixed_body) {
    return fail(errc::protocol, "frame body of " + std::to_string(body) + " bytes is shorter than the " +
                                std::to_string(frame_fixed_body) + "-byte header");
  }
  if (body > max_body) {
    return fail(errc::protocol, "frame body of " + std::to_string(body) + " bytes exceeds the maximum of " +
                                std::to_string(max_body));
  }
  return body;
}

Result<std::optional<DataHead>> decode_data_head(std::span<const std::byte> head, std::uint32_t body_length) {
  if (head.size() < data_head_body || body_length < data_head_body) return std::optional<DataHead>{};
  Reader in(head.first(data_head_body));
  CORMA_TRY(auto type, in.u8("frame type"));
  if (type != static_cast<std::uint8_t>(MessageType::data)) return std::optional<DataHead>{};
  CORMA_TRY(auto reserved8, in.u8("frame reserved byte"));
  CORMA_TRY(auto reserved16, in.u16("frame reserved bytes"));
  if (reserved8 != 0 || reserved16 != 0) return fail(errc::protocol, "frame reserved bytes are not zero");
  DataHead data;
  CORMA_TRY(data.request_id, in.u64("frame request id"));
  CORMA_TRY(data.offset, in.u64("data offset"));
  CORMA_TRY(data.len, in.u32("data length"));
  if (data.len != body_length - data_head_body) {
    return fail(errc::protocol, "data length " + std::to_string(data.len) + " disagrees with the " +
                                    std::to_string(body_length - data_head_body) + " bytes that follow");
  }
  return std::optional<DataHead>{data};
}

Result<Frame> decode_frame_body(std::span<const std::byte> body) {
  Reader in(body);
  CORMA_TRY(auto type, in.u8("frame type"));
  if (!known_type(type)) return fail(errc::protocol, "unknown message type " + std::to_string(type));
  CORMA_TRY(auto reserved8, in.u8("frame reserved byte"));
  CORMA_TRY(auto reserved16, in.u16("frame reserved bytes"));
  if (reserved8 != 0 || reserved16 != 0) return fail(errc::protocol, "frame reserved bytes are not zero");
  Frame frame;
  CORMA_TRY(frame.request_id, in.u64("frame request id"));
  const auto message_type = static_cast<MessageType>(type);
  CORMA_TRY(frame.message, get_payload(message_type, in));
  if (in.remaining() != 0) {
    return fail(errc::protocol, std::to_string(in.remaining()) + " trailing bytes after a " +
                                std::string(type_name(message_type)) + " message");
  }
  return frame;
}

}  // namespace corma::rendezvous
