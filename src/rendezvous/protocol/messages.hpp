// The rendezvous control protocol: frames and messages, with strict
// decoders. docs/protocol.md describes the same layout in prose.
#pragma once

#include <corma/descriptor.hpp>
#include <corma/error.hpp>
#include <corma/rendezvous.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <array>
#include <vector>

namespace corma::rendezvous {

/// The version a consumer offers and an owner speaks; an owner also
/// serves consumers of every version from oldest_protocol_version on.
inline constexpr std::uint16_t protocol_version = rendezvous_protocol_version;
inline constexpr std::uint16_t oldest_protocol_version = 1;
/// Version 2 adds the batch frames (acquire_many, granted, release_many,
/// released_many), hello_ok's max_batch, and RDMA windows (rdma_window,
/// next_window).
inline constexpr std::uint16_t batch_protocol_version = 2;
/// Version 3 adds push (push_open, push_offer, push_connect, push_ready,
/// push, pushed): the owner writes an object into memory the consumer
/// offers for it.
inline constexpr std::uint16_t push_protocol_version = 3;
/// Version 4 adds the connection's heartbeat (heartbeat, heartbeat_ok):
/// one frame keeps every lease of the connection alive.
inline constexpr std::uint16_t heartbeat_protocol_version = 4;
/// Version 5 adds the generation of what an answer lends or writes (which
/// version of the object): a u64 after the fields of rdma_grant, chunked,
/// rdma_window and pushed, and in `granted` one per answer after the
/// answers. An owner sends it to version 5 sessions only (fit_to_version).
inline constexpr std::uint16_t generation_protocol_version = 5;
/// Version 6 adds the owner's proof (prove, proof): before its hello, a
/// consumer holding the cluster key sends a fresh challenge, and the owner
/// answers with its id and an HMAC-SHA-256 of both under that key.
inline constexpr std::uint16_t proof_protocol_version = 6;
/// Bytes of a prove's challenge and of a proof's MAC.
inline constexpr std::size_t proof_challenge_size = 32;
inline constexpr std::size_t proof_mac_size = 32;
/// Longer owner ids in a proof make it malformed.
inline constexpr std::size_t max_proof_owner_id = 255;
/// u32 body length, u8 type, u8 reserved, u16 reserved, u64 request id.
inline constexpr std::size_t frame_header_size = 16;
/// Bytes after the length prefix of the fixed header.
inline constexpr std::size_t frame_fixed_body = frame_header_size - 4;
/// Longer object names make a frame malformed.
inline constexpr std::size_t max_name_length = max_object_name_length;
/// Detail text in error replies; longer ones are refused.
inline constexpr std::size_t max_detail_length = 1024;
/// Objects one batch frame may name; the codec refuses more. An owner
/// announces its own, smaller or equal, limit in hello_ok.
inline constexpr std::size_t max_batch_objects = 1024;
/// The largest frame body either side accepts unless configured otherwise:
/// a 1 MiB data chunk plus its headers.
inline constexpr std::uint32_t default_max_frame_body = (1u << 20) + 64;

// The protocol's single list of messages: the type enum, the Message
// variant (in this order), each type's name, and the decoder's dispatch are
// all generated from it, so a message is added in one place.
//   X(wire value, name, payload type)
// The name is also the decoder's: get_<name>(Reader&) in messages.cpp.
#define CORMA_RENDEZVOUS_MESSAGES(X) \
  X(1, hello, Hello)                 \
  X(2, hello_ok, HelloOk)            \
  X(3, acquire, Acquire)             \
  X(4, rdma_grant, RdmaGrant)        \
  X(5, chunked, Chunked)             \
  X(6, not_found, NotFound)          \
  X(7, pull, Pull)                   \
  X(8, data, Data)                   \
  X(9, renew, Renew)                 \
  X(10, renewed, Renewed)            \
  X(11, release, Release)            \
  X(12, released, Released)          \
  X(13, error, ErrorReply)           \
  X(14, acquire_many, AcquireMany)   \
  X(15, granted, Granted)            \
  X(16, release_many, ReleaseMany)   \
  X(17, released_many, ReleasedMany) \
  X(18, rdma_window, RdmaWindow)     \
  X(19, next_window, NextWindow)     \
  X(20, push_open, PushOpen)         \
  X(21, push_offer, PushOffer)       \
  X(22, push_connect, PushConnect)   \
  X(23, push_ready, PushReady)       \
  X(24, push, Push)                  \
  X(25, pushed, Pushed)              \
  X(26, heartbeat, Heartbeat)        \
  X(27, heartbeat_ok, HeartbeatOk)    \
  X(28, prove, Prove)                \
  X(29, proof, Proof)

#define CORMA_MESSAGE_ENUMERATOR(value, name, Type) name = value,
enum class MessageType : std::uint8_t { CORMA_RENDEZVOUS_MESSAGES(CORMA_MESSAGE_ENUMERATOR) };
#undef CORMA_MESSAGE_ENUMERATOR

/// The message's name as the protocol document spells it ("acquire_many").
[[nodiscard]] std::string_view type_name(MessageType type) noexcept;

/// Why an owner answered `chunked`: corma::ChunkedReason, up to no_window
/// (rdma_failed never travels).
using corma::ChunkedReason;
inline constexpr ChunkedReason last_wire_reason = ChunkedReason::no_window;


/// Consumer → owner, first frame: protocol version and, optionally, an RDMA
/// peer offer for one backend.
struct Hello {
  std::uint16_t version = protocol_version;
  BackendId backend{};                 ///< none: the consumer only pulls chunks
  std::vector<std::byte> peer_offer;   ///< empty when backend is none
};
/// Owner → consumer: the answer to the peer offer (empty when not taken).
struct HelloOk {
  std::uint16_t version = protocol_version;
  BackendId backend{};                 ///< the backend both sides now share, if any
  std::vector<std::byte> peer_answer;
  std::uint32_t max_frame_body = default_max_frame_body;
  /// Version 2 on: the most objects one acquire_many or release_many may
  /// name (1..max_batch_objects). Not on the wire in version 1 (0 there).
  std::uint16_t max_batch = 64;
};
struct Acquire {
  std::string name;
  bool wants_rdma = false;
};
/// Version 5: which version of the object an answer lends or writes, a
/// number the owner gives each publication and each version its resolver
/// finds (never 0 on the wire). Absent for older sessions.
using Generation = std::optional<std::uint64_t>;
struct RdmaGrant {
  std::uint64_t lease = 0;
  std::uint64_t size = 0;
  std::uint32_t lease_timeout_ms = 0;
  std::vector<std::byte> descriptor;  ///< an encoded descriptor (corma/descriptor.hpp)
  Generation generation{};
};
struct Chunked {
  std::uint64_t lease = 0;
  std::uint64_t size = 0;
  std::uint32_t chunk_size = 0;
  std::uint32_t lease_timeout_ms = 0;
  ChunkedReason reason = ChunkedReason::no_offer;
  Generation generation{};
};
struct NotFound {};
struct Pull {
  std::uint64_t lease = 0;
  std::uint64_t offset = 0;
  std::uint32_t len = 0;
};
struct Data {
  std::uint64_t offset = 0;
  std::vector<std::byte> bytes;
  /// Never encoded: set by a reader that read the payload straight into
  /// memory its caller named for this answer (FramedConnection::read's
  /// landing), `bytes` then left empty. How many bytes landed there.
  std::uint32_t landed = 0;
};
struct Renew {
  std::uint64_t lease = 0;
};
struct Renewed {
  std::uint32_t lease_timeout_ms = 0;
};
struct Release {
  std::uint64_t lease = 0;
};
struct Released {};
struct ErrorReply {
  std::uint16_t code = 0;  ///< a corma::errc value
  std::string detail;
};

/// Version 2: an object larger than what the owner's budget holds is lent
/// in windows: [offset, offset + window_len) registered on its own, with its
/// own descriptor, under the object's lease. Answers an acquire (or an
/// entry of `granted`) with the first window, and each next_window.
struct RdmaWindow {
  std::uint64_t lease = 0;
  std::uint64_t size = 0;          ///< the whole object's
  std::uint32_t lease_timeout_ms = 0;
  std::uint64_t offset = 0;        ///< where the window starts in the object
  std::uint64_t window_len = 0;    ///< > 0; the descriptor's length
  std::vector<std::byte> descriptor;
  Generation generation{};         ///< the lease's, in every window
};
/// Version 2: moves a windowed lease's window to start at `offset`: the end
/// of the current one, or further on (windows only move forward; a consumer
/// reading a byte range of the object skips to it).
struct NextWindow {
  std::uint64_t lease = 0;
  std::uint64_t offset = 0;
};

/// Version 2: many objects in one request. The owner answers `granted`,
/// one answer per name in the same order.
struct AcquireMany {
  std::vector<std::string> names;  ///< 1..max_batch_objects, each as in Acquire
  bool wants_rdma = false;
};
/// One object's answer in `granted`: what `acquire` would have answered.
using Grant = std::variant<RdmaGrant, Chunked, NotFound, ErrorReply, RdmaWindow>;
struct Granted {
  std::vector<Grant> grants;
};
/// Version 2: ends many leases in one request; answered `released_many`.
struct ReleaseMany {
  std::vector<std::uint64_t> leases;  ///< 1..max_batch_objects
};
/// One code per lease, in order: 0 when it was released, else the corma::errc
/// a single release would have failed with (object_changed), or
/// region_not_found for a lease this connection does not hold.
struct ReleasedMany {
  std::vector<std::uint16_t> codes;
};

/// Version 3, consumer → owner: asks for a peer the owner initiates, to
/// write into this consumer (the reverse of the hello's peer, whose
/// initiator is the consumer). Answered `push_offer`, or `error`
/// (`not_configured` when the owner takes no pushes).
struct PushOpen {};
/// Owner → consumer: the owner backend's peer offer (max_peer_blob_size).
struct PushOffer {
  std::vector<std::byte> peer_offer;
};
/// Consumer → owner: the consumer backend's answer to that offer.
struct PushConnect {
  std::vector<std::byte> peer_answer;
};
/// Owner → consumer: the push peer is connected.
struct PushReady {};
/// Consumer → owner: write the object `name` into the memory `landing`
/// describes (an encoded descriptor of the consumer's registration, at
/// least the object's size), then notify `tag` when `notify` is set.
/// Answered `pushed` once the bytes are in place at the consumer, or as an
/// acquire would be refused (`not_found`, `error`).
struct Push {
  std::string name;
  bool notify = false;
  std::uint64_t tag = 0;
  std::vector<std::byte> landing;
};
/// Owner → consumer: the object's `size` bytes are at the landing's start.
struct Pushed {
  std::uint64_t size = 0;
  Generation generation{};
};
/// Consumer → owner (version 4): every lease this connection holds is
/// renewed. Answered `heartbeat_ok`.
struct Heartbeat {};
/// Owner → consumer: the leases renewed (those this connection holds now)
/// and the lease timeout they run on.
struct HeartbeatOk {
  std::uint32_t leases = 0;
  std::uint32_t lease_timeout_ms = 0;
};

/// Consumer → owner (version 6), only as the first frame, before the hello:
/// prove you hold the cluster key. Answered `proof`, or `error` `not_owned`
/// by an owner without a key; the hello follows on the same connection.
struct Prove {
  std::array<std::byte, proof_challenge_size> challenge{};
};
/// Owner → consumer: who it is, and HMAC-SHA-256(cluster key, the proof's
/// context, challenge, owner id) (rendezvous/protocol/owner_proof.hpp).
struct Proof {
  std::string owner_id;  ///< 1 to max_proof_owner_id bytes
  std::array<std::byte, proof_mac_size> mac{};
};

/// The largest encoding of one answer in `granted` (a window with the
/// largest descriptor, and its generation), and so the most answers a
/// `granted` frame of default_max_frame_body always holds: an owner never
/// announces more.
inline constexpr std::size_t max_grant_size =
    1 + 8 + 8 + 4 + 8 + 8 + 4 + descriptor_header_size + max_packed_key_size + 8;
inline constexpr std::size_t max_grants_per_frame = (default_max_frame_body - frame_fixed_body - 2) / max_grant_size;
static_assert(max_grants_per_frame >= 64 && max_grants_per_frame <= max_batch_objects);

/// std::variant of every type but the first (the list's expansion starts
/// with a placeholder, so that each entry can bring its own comma).
template <class First, class... Types>
struct VariantOfRest {
  using type = std::variant<Types...>;
};

#define CORMA_MESSAGE_TYPE(value, name, Type) , Type
/// Every message, in the list's order.
using Message = VariantOfRest<void CORMA_RENDEZVOUS_MESSAGES(CORMA_MESSAGE_TYPE)>::type;
#undef CORMA_MESSAGE_TYPE

struct Frame {
  std::uint64_t request_id = 0;
  Message message;
};

[[nodiscard]] MessageType type_of(const Message& message) noexcept;

/// The generation an answer carries, if it is one that carries it (in a
/// `granted`, see grant_generation).
[[nodiscard]] Generation generation_of(const Message& message) noexcept;
[[nodiscard]] Generation grant_generation(const Grant& grant) noexcept;
/// Drops from `message` what a session of `version` does not read (the
/// generations, before version 5): answers are written as their reader's
/// decoder expects them, and that decoder refuses trailing bytes.
void fit_to_version(Message& message, std::uint16_t version) noexcept;

/// The whole frame: length prefix, fixed header, payload.
[[nodiscard]] std::vector<std::byte> encode_frame(const Frame& frame);
/// The bytes of a `data` frame before its `len` payload bytes: sent ahead of
/// bytes written straight from where they live. Head then payload equal
/// encode_frame(Frame{request_id, Data{offset, payload}}).
[[nodiscard]] std::vector<std::byte> encode_data_head(std::uint64_t request_id, std::uint64_t offset, std::size_t len);

/// Bytes of a `data` frame's body ahead of its payload: the fixed header,
/// the offset and the length.
inline constexpr std::size_t data_head_body = frame_fixed_body + 12;

/// What a `data` frame says ahead of its payload.
struct DataHead {
  std::uint64_t request_id = 0;
  std::uint64_t offset = 0;
  std::uint32_t len = 0;
};

/// Decodes the first data_head_body bytes of a frame body `body_length`
/// bytes long, so that the payload can be read straight to where it
/// belongs: nothing when the frame is not a `data` frame (its body is then
/// decoded whole), `protocol` for reserved bytes that are not zero or a
/// length that disagrees with the body's, as decode_frame_body() would.
[[nodiscard]] Result<std::optional<DataHead>> decode_data_head(std::span<const std::byte> head,
                                                               std::uint32_t body_length);

/// Reads the 4-byte length prefix; refuses a body shorter than the fixed
/// header or longer than `max_body` (`protocol`) before anything is read.
[[nodiscard]] Result<std::uint32_t> decode_frame_length(std::span<const std::byte> prefix,
                                                        std::uint32_t max_body);

/// Decodes everything after the length prefix. Strict: unknown type,
/// non-zero reserved bytes, a field running past the end, a length field
/// over its bound, an invalid enum value, or trailing bytes → `protocol`.
[[nodiscard]] Result<Frame> decode_frame_body(std::span<const std::byte> body);

}  // namespace corma::rendezvous
