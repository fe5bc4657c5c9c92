// The property the fuzzers (and the corpus replay test) check: whatever the
// rendezvous decoders accept re-encodes to the very same bytes, and decoding
// that re-encoding gives the same value back. Whatever they refuse is refused
// with the documented codes. Header-only: the fuzzers and the corpus replay
// test both include it.
#pragma once

#include <corma/descriptor.hpp>

#include "rendezvous/protocol/messages.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace corma::fuzz {

namespace rv = corma::rendezvous;

// ---- field-wise equality of messages (messages.hpp defines none) ------------

inline bool same(const rv::Hello& a, const rv::Hello& b) {
  return a.version == b.version && a.backend == b.backend && a.peer_offer == b.peer_offer;
}
inline bool same(const rv::HelloOk& a, const rv::HelloOk& b) {
  return a.version == b.version && a.backend == b.backend && a.peer_answer == b.peer_answer &&
         a.max_frame_body == b.max_frame_body && a.max_batch == b.max_batch;
}
inline bool same(const rv::Acquire& a, const rv::Acquire& b) {
  return a.name == b.name && a.wants_rdma == b.wants_rdma;
}
inline bool same(const rv::RdmaGrant& a, const rv::RdmaGrant& b) {
  return a.lease == b.lease && a.size == b.size && a.lease_timeout_ms == b.lease_timeout_ms &&
         a.descriptor == b.descriptor && a.generation == b.generation;
}
inline bool same(const rv::Chunked& a, const rv::Chunked& b) {
  return a.lease == b.lease && a.size == b.size && a.chunk_size == b.chunk_size &&
         a.lease_timeout_ms == b.lease_timeout_ms && a.reason == b.reason && a.generation == b.generation;
}
inline bool same(const rv::NotFound&, const rv::NotFound&) { return true; }
inline bool same(const rv::Pull& a, const rv::Pull& b) {
  return a.lease == b.lease && a.offset == b.offset && a.len == b.len;
}
inline bool same(const rv::Data& a, const rv::Data& b) { return a.offset == b.offset && a.bytes == b.bytes; }
inline bool same(const rv::Renew& a, const rv::Renew& b) { return a.lease == b.lease; }
inline bool same(const rv::Renewed& a, const rv::Renewed& b) { return a.lease_timeout_ms == b.lease_timeout_ms; }
inline bool same(const rv::Release& a, const rv::Release& b) { return a.lease == b.lease; }
inline bool same(const rv::Released&, const rv::Released&) { return true; }
inline bool same(const rv::ErrorReply& a, const rv::ErrorReply& b) {
  return a.code == b.code && a.detail == b.detail;
}

inline bool same(const rv::RdmaWindow& a, const rv::RdmaWindow& b) {
  return a.lease == b.lease && a.size == b.size && a.lease_timeout_ms == b.lease_timeout_ms && a.offset == b.offset &&
         a.window_len == b.window_len && a.descriptor == b.descriptor && a.generation == b.generation;
}
inline bool same(const rv::NextWindow& a, const rv::NextWindow& b) { return a.lease == b.lease && a.offset == b.offset; }
inline bool same(const rv::AcquireMany& a, const rv::AcquireMany& b) {
  return a.names == b.names && a.wants_rdma == b.wants_rdma;
}
inline bool same(const rv::ReleaseMany& a, const rv::ReleaseMany& b) { return a.leases == b.leases; }
inline bool same(const rv::ReleasedMany& a, const rv::ReleasedMany& b) { return a.codes == b.codes; }
inline bool same(const rv::PushOpen&, const rv::PushOpen&) { return true; }
inline bool same(const rv::PushOffer& a, const rv::PushOffer& b) { return a.peer_offer == b.peer_offer; }
inline bool same(const rv::PushConnect& a, const rv::PushConnect& b) { return a.peer_answer == b.peer_answer; }
inline bool same(const rv::PushReady&, const rv::PushReady&) { return true; }
inline bool same(const rv::Push& a, const rv::Push& b) {
  return a.name == b.name && a.notify == b.notify && a.tag == b.tag && a.landing == b.landing;
}
inline bool same(const rv::Pushed& a, const rv::Pushed& b) {
  return a.size == b.size && a.generation == b.generation;
}
inline bool same(const rv::Heartbeat&, const rv::Heartbeat&) { return true; }
inline bool same(const rv::HeartbeatOk& a, const rv::HeartbeatOk& b) {
  return a.leases == b.leases && a.lease_timeout_ms == b.lease_timeout_ms;
}
inline bool same(const rv::Prove& a, const rv::Prove& b) { return a.challenge == b.challenge; }
inline bool same(const rv::Proof& a, const rv::Proof& b) { return a.owner_id == b.owner_id && a.mac == b.mac; }
inline bool same(const rv::Granted& a, const rv::Granted& b);

/// Two variants (messages, grants) hold the same alternative, field for field.
template <class... Ts>
bool same_alternative(const std::variant<Ts...>& a, const std::variant<Ts...>& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&b](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        return same(x, std::get<T>(b));
      },
      a);
}

inline bool same(const rv::Grant& a, const rv::Grant& b) { return same_alternative(a, b); }
inline bool same(const rv::Granted& a, const rv::Granted& b) {
  return std::equal(a.grants.begin(), a.grants.end(), b.grants.begin(), b.grants.end(),
                    [](const rv::Grant& x, const rv::Grant& y) { return same(x, y); });
}

inline bool same(const rv::Message& a, const rv::Message& b) { return same_alternative(a, b); }

inline bool same(const rv::Frame& a, const rv::Frame& b) {
  return a.request_id == b.request_id && same(a.message, b.message);
}

// ---- the round-trip checks -----------------------------------------------------

struct Check {
  bool accepted = false;  ///< the decoder accepted the input
  std::string mismatch;   ///< empty when the property holds
};

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

/// A descriptor record.
inline Check check_descriptor(std::span<const std::byte> bytes) {
  Check c;
  auto decoded = decode_descriptor(bytes);
  if (!decoded) {
    if (!decoded.error().is(errc::protocol) && !decoded.error().is(errc::invalid_key)) {
      c.mismatch = "refused with an undocumented code: " + decoded.error().message();
    }
    return c;
  }
  c.accepted = true;
  const auto again = encode(decoded.value());
  if (!same_bytes(again, bytes)) {
    c.mismatch = "re-encoding differs from the accepted input";
    return c;
  }
  auto redecoded = decode_descriptor(again);
  if (!redecoded) {
    c.mismatch = "re-encoding refused: " + redecoded.error().message();
  } else if (!(redecoded.value() == decoded.value())) {
    c.mismatch = "decoding the re-encoding gives another descriptor";
  } else {
    auto described = describe(decoded.value());
    if (!described) {
      c.mismatch = "describe refuses what decode accepted: " + described.error().message();
    } else if (!same_bytes(described.value(), bytes)) {
      c.mismatch = "describe(decode(bytes)) != bytes";
    }
  }
  return c;
}

/// A whole frame: the 4-byte length prefix, then the body. The body is
/// decoded whatever the prefix says, so every input exercises the body
/// decoder; `accepted` says whether the frame as a whole was.
inline Check check_frame(std::span<const std::byte> bytes,
                         std::uint32_t max_body = rv::default_max_frame_body) {
  Check c;
  if (bytes.size() < 4) {
    if (rv::decode_frame_length(bytes, max_body)) c.mismatch = "accepted a short length prefix";
    return c;
  }
  auto length = rv::decode_frame_length(bytes.first(4), max_body);
  if (!length && !length.error().is(errc::protocol)) {
    c.mismatch = "length refused with an undocumented code: " + length.error().message();
    return c;
  }
  if (length && (length.value() < rv::frame_fixed_body || length.value() > max_body)) {
    c.mismatch = "accepted a length outside its bounds";
    return c;
  }
  const auto body = bytes.subspan(4);
  auto decoded = rv::decode_frame_body(body);
  if (!decoded) {
    if (!decoded.error().is(errc::protocol)) {
      c.mismatch = "body refused with an undocumented code: " + decoded.error().message();
    }
    return c;
  }
  c.accepted = length && length.value() == body.size();
  const auto again = rv::encode_frame(decoded.value());
  if (again.size() < 4 || !same_bytes(std::span(again).subspan(4), body)) {
    c.mismatch = "re-encoding differs from the accepted body";
    return c;
  }
  if (c.accepted && !same_bytes(again, bytes)) {
    c.mismatch = "re-encoding differs from the accepted frame";
    return c;
  }
  auto again_length = rv::decode_frame_length(std::span(again).first(4), 0xffffffffU);
  if (!again_length || again_length.value() != body.size()) {
    c.mismatch = "re-encoding's length prefix disagrees with its body";
    return c;
  }
  auto redecoded = rv::decode_frame_body(std::span(again).subspan(4));
  if (!redecoded) {
    c.mismatch = "re-encoding refused: " + redecoded.error().message();
  } else if (!same(redecoded.value(), decoded.value())) {
    c.mismatch = "decoding the re-encoding gives another frame";
  } else if (rv::type_of(decoded.value().message) != static_cast<rv::MessageType>(body[0])) {
    c.mismatch = "type_of disagrees with the frame's type byte";
  }
  return c;
}

}  // namespace corma::fuzz
