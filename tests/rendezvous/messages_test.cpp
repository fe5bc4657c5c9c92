// The rendezvous control frames: exact layout, round trips of every message
// type, every refusal the decoders promise, truncations and single-byte
// corruptions.
#include "rendezvous/protocol/messages.hpp"

#include "roundtrip.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using corma::BackendId;
using corma::errc;
namespace rv = corma::rendezvous;
using rv::Frame;
using rv::Message;
using rv::MessageType;

/// Payload offsets are relative to the body (after the length prefix).
constexpr std::size_t payload_at = rv::frame_fixed_body;

std::vector<std::byte> blob(std::size_t size, std::uint8_t seed = 3) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((seed + i * 13) & 0xffU);
  return bytes;
}

std::vector<std::byte> descriptor_bytes(std::size_t key_size = 16) {
  return corma::encode(corma::RemoteRegion{BackendId{1}, 5, 0x10000, 1 << 20, blob(key_size)});
}

/// 32 bytes counting up from `first` (a challenge, or a MAC).
std::array<std::byte, 32> challenge_of(int first) {
  std::array<std::byte, 32> bytes{};
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(first + static_cast<int>(i));
  return bytes;
}

/// One frame of every type, some with their variants.
std::vector<Frame> samples() {
  return {
      {1, rv::Hello{}},
      {2, rv::Hello{rv::protocol_version, BackendId{1}, blob(37)}},
      {3, rv::HelloOk{}},
      {4, rv::HelloOk{rv::protocol_version, BackendId{2}, blob(12), 4096}},
      {5, rv::Acquire{"a/b/object.bin", true}},
      {6, rv::Acquire{"x", false}},
      {7, rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes()}},
      {8, rv::Chunked{12, 999, 65536, 15000, rv::ChunkedReason::budget}},
      {9, rv::Chunked{13, 0, 1, 0, rv::ChunkedReason::registration_failed}},
      {10, rv::NotFound{}},
      {11, rv::Pull{12, 65536, 65536}},
      {12, rv::Data{65536, blob(40)}},
      {13, rv::Data{7, {}}},
      {14, rv::Renew{12}},
      {15, rv::Renewed{30000}},
      {16, rv::Release{12}},
      {17, rv::Released{}},
      {18, rv::ErrorReply{static_cast<std::uint16_t>(errc::shutting_down), "owner is draining"}},
      {std::numeric_limits<std::uint64_t>::max(), rv::ErrorReply{0, ""}},
      {19, rv::HelloOk{1, BackendId::none, {}, 4096, 0}},
      {20, rv::AcquireMany{{"a", "b/c", std::string(300, 'x')}, true}},
      {21, rv::Granted{{rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes()},
                        rv::Chunked{12, 999, 65536, 15000, rv::ChunkedReason::budget}, rv::NotFound{},
                        rv::ErrorReply{static_cast<std::uint16_t>(errc::budget_exceeded), "too many leases"}}}},
      {22, rv::ReleaseMany{{1, 2, std::numeric_limits<std::uint64_t>::max()}}},
      {23, rv::ReleasedMany{{0, static_cast<std::uint16_t>(errc::object_changed), 0xffff}}},
      {24, rv::RdmaWindow{31, 10 << 20, 30000, 4 << 20, 4 << 20, descriptor_bytes()}},
      {25, rv::NextWindow{31, 8 << 20}},
      {26, rv::Granted{{rv::RdmaWindow{32, 3 << 20, 1000, 0, 1 << 20, descriptor_bytes()}}}},
      {27, rv::PushOpen{}},
      {28, rv::PushOffer{blob(20)}},
      {29, rv::PushConnect{blob(33)}},
      {30, rv::PushReady{}},
      {31, rv::Push{"kv/block-7", true, 0x1122334455667788, descriptor_bytes()}},
      {32, rv::Push{"x", false, 0, descriptor_bytes()}},
      {33, rv::Pushed{1 << 20}},
      {34, rv::Heartbeat{}},
      {35, rv::HeartbeatOk{512, 10000}},
      {36, rv::Prove{challenge_of(7)}},
      {37, rv::Proof{"owner-a", challenge_of(9)}},
      {38, rv::Proof{std::string(rv::max_proof_owner_id, 'o'), challenge_of(0)}},
  };
}

std::vector<std::byte> body_of(const Frame& frame) {
  auto bytes = rv::encode_frame(frame);
  return {bytes.begin() + 4, bytes.end()};
}

/// Overwrites `width` bytes at `at`, little-endian.
void put_le(std::vector<std::byte>& bytes, std::size_t at, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) bytes.at(at + i) = static_cast<std::byte>((value >> (8 * i)) & 0xffU);
}

/// Appends `width` bytes, little-endian.
void append_le(std::vector<std::byte>& bytes, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) bytes.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xffU));
}

/// A body with the fixed header for `type` and nothing else.
std::vector<std::byte> header(std::uint8_t type, std::uint64_t request_id = 42) {
  std::vector<std::byte> bytes;
  append_le(bytes, type, 1);
  append_le(bytes, 0, 3);
  append_le(bytes, request_id, 8);
  return bytes;
}

testing::AssertionResult refused(std::span<const std::byte> body) {
  auto decoded = rv::decode_frame_body(body);
  if (decoded) return testing::AssertionFailure() << "accepted";
  if (!decoded.error().is(errc::protocol)) {
    return testing::AssertionFailure() << "refused with " << decoded.error().message();
  }
  return testing::AssertionSuccess() << decoded.error().message();
}

testing::AssertionResult round_trips(const Frame& frame) {
  const auto bytes = rv::encode_frame(frame);
  auto length = rv::decode_frame_length(std::span(bytes).first(4), std::numeric_limits<std::uint32_t>::max());
  if (!length) return testing::AssertionFailure() << "length: " << length.error().message();
  if (length.value() != bytes.size() - 4) return testing::AssertionFailure() << "length prefix " << length.value();
  auto decoded = rv::decode_frame_body(std::span(bytes).subspan(4));
  if (!decoded) return testing::AssertionFailure() << "body: " << decoded.error().message();
  if (!corma::fuzz::same(decoded.value(), frame)) return testing::AssertionFailure() << "decodes to another frame";
  if (rv::encode_frame(decoded.value()) != bytes) return testing::AssertionFailure() << "re-encodes differently";
  return testing::AssertionSuccess();
}

/// Version 5's answers, each with the generation of what it lends or writes.
std::vector<Frame> generation_samples() {
  return {
      {40, rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes(), 7}},
      {41, rv::Chunked{12, 999, 65536, 15000, rv::ChunkedReason::budget, std::numeric_limits<std::uint64_t>::max()}},
      {42, rv::RdmaWindow{31, 10 << 20, 30000, 4 << 20, 4 << 20, descriptor_bytes(), 1}},
      {43, rv::Pushed{1 << 20, 99}},
      {44, rv::Granted{{rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes(), 5}, rv::NotFound{},
                        rv::Chunked{12, 999, 65536, 15000, rv::ChunkedReason::budget, 6},
                        rv::ErrorReply{static_cast<std::uint16_t>(errc::budget_exceeded), "too many leases"},
                        rv::RdmaWindow{32, 3 << 20, 1000, 0, 1 << 20, descriptor_bytes(), 8}}}},
  };
}

/// The same frame as a session older than version 5 reads it.
Frame without_generations(Frame frame) {
  rv::fit_to_version(frame.message, rv::heartbeat_protocol_version);
  return frame;
}

// ---- layout ----------------------------------------------------------------------

TEST(FrameLayout, PullIsLittleEndianFixedWidthUnpadded) {
  const auto bytes = rv::encode_frame({0x0102030405060708ULL, rv::Pull{0x1112131415161718ULL,
                                                                      0x2122232425262728ULL, 0x31323334}});
  const std::vector<std::uint8_t> expected = {
      32,   0,    0,    0,                                // body length: 12 + 20
      7,    0,    0,    0,                                // type, reserved
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,    // request id
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,    // lease
      0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,    // offset
      0x34, 0x33, 0x32, 0x31};                            // len
  ASSERT_EQ(bytes.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(bytes[i], static_cast<std::byte>(expected[i])) << "byte " << i;
  }
}

TEST(FrameLayout, ADataHeadFollowedByItsBytesIsTheDataFrame) {
  for (const std::size_t len : {std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20}) {
    std::vector<std::byte> payload(len);
    for (std::size_t i = 0; i < len; ++i) payload[i] = static_cast<std::byte>(i * 7 + 3);
    const std::uint64_t request_id = 0x1122334455667788ULL;
    const std::uint64_t offset = 5ULL << 32;
    auto streamed = rv::encode_data_head(request_id, offset, len);
    streamed.insert(streamed.end(), payload.begin(), payload.end());
    EXPECT_EQ(streamed, rv::encode_frame(Frame{request_id, rv::Data{offset, payload}})) << len << " bytes";
  }
}

TEST(FrameLayout, PayloadSizes) {
  auto payload = [](const Message& m) { return rv::encode_frame({0, m}).size() - rv::frame_header_size; };
  EXPECT_EQ(payload(rv::Hello{rv::protocol_version, BackendId{3}, blob(5)}), 2U + 1U + 4U + 5U);
  EXPECT_EQ(payload(rv::HelloOk{2, BackendId{3}, blob(5), 1, 64}), 2U + 1U + 4U + 5U + 4U + 2U);
  EXPECT_EQ(payload(rv::HelloOk{1, BackendId{3}, blob(5), 1, 0}), 2U + 1U + 4U + 5U + 4U) << "no max_batch in v1";
  EXPECT_EQ(payload(rv::AcquireMany{{"ab", "c"}, true}), 2U + 1U + (2U + 2U) + (2U + 1U));
  EXPECT_EQ(payload(rv::Granted{{rv::NotFound{}, rv::Chunked{}}}), 2U + 1U + (1U + 25U));
  EXPECT_EQ(payload(rv::ReleaseMany{{1, 2, 3}}), 2U + 3U * 8U);
  EXPECT_EQ(payload(rv::ReleasedMany{{0, 1}}), 2U + 2U * 2U);
  EXPECT_EQ(payload(rv::RdmaWindow{1, 9, 3, 0, 9, blob(7)}), 8U + 8U + 4U + 8U + 8U + 4U + 7U);
  EXPECT_EQ(payload(rv::NextWindow{1, 2}), 8U + 8U);
  EXPECT_EQ(payload(rv::Acquire{"abc", true}), 2U + 3U + 1U);
  EXPECT_EQ(payload(rv::RdmaGrant{1, 2, 3, blob(9)}), 8U + 8U + 4U + 4U + 9U);
  EXPECT_EQ(payload(rv::Chunked{}), 8U + 8U + 4U + 4U + 1U);
  EXPECT_EQ(payload(rv::NotFound{}), 0U);
  EXPECT_EQ(payload(rv::Pull{}), 8U + 8U + 4U);
  EXPECT_EQ(payload(rv::Data{0, blob(6)}), 8U + 4U + 6U);
  EXPECT_EQ(payload(rv::Renew{}), 8U);
  EXPECT_EQ(payload(rv::Renewed{}), 4U);
  EXPECT_EQ(payload(rv::Release{}), 8U);
  EXPECT_EQ(payload(rv::Released{}), 0U);
  EXPECT_EQ(payload(rv::ErrorReply{1, "abcd"}), 2U + 2U + 4U);
  EXPECT_EQ(payload(rv::Prove{}), 32U);
  EXPECT_EQ(payload(rv::Proof{"abc", {}}), 1U + 3U + 32U);
}

TEST(FrameRefusal, AProofWithoutAnOwnerIdOrAShortChallengeOrMac) {
  auto no_id = header(static_cast<std::uint8_t>(MessageType::proof));
  append_le(no_id, 0, 1);
  for (int i = 0; i < 32; ++i) append_le(no_id, 1, 1);
  EXPECT_TRUE(refused(no_id));
  auto short_mac = header(static_cast<std::uint8_t>(MessageType::proof));
  append_le(short_mac, 1, 1);
  append_le(short_mac, 'o', 1);
  for (int i = 0; i < 31; ++i) append_le(short_mac, 1, 1);
  EXPECT_TRUE(refused(short_mac));
  auto short_challenge = header(static_cast<std::uint8_t>(MessageType::prove));
  for (int i = 0; i < 31; ++i) append_le(short_challenge, 1, 1);
  EXPECT_TRUE(refused(short_challenge));
}

TEST(FrameLayout, TypeOfEveryMessage) {
  EXPECT_EQ(rv::type_of(rv::Hello{}), MessageType::hello);
  EXPECT_EQ(rv::type_of(rv::HelloOk{}), MessageType::hello_ok);
  EXPECT_EQ(rv::type_of(rv::Acquire{}), MessageType::acquire);
  EXPECT_EQ(rv::type_of(rv::RdmaGrant{}), MessageType::rdma_grant);
  EXPECT_EQ(rv::type_of(rv::Chunked{}), MessageType::chunked);
  EXPECT_EQ(rv::type_of(rv::NotFound{}), MessageType::not_found);
  EXPECT_EQ(rv::type_of(rv::Pull{}), MessageType::pull);
  EXPECT_EQ(rv::type_of(rv::Data{}), MessageType::data);
  EXPECT_EQ(rv::type_of(rv::Renew{}), MessageType::renew);
  EXPECT_EQ(rv::type_of(rv::Renewed{}), MessageType::renewed);
  EXPECT_EQ(rv::type_of(rv::Release{}), MessageType::release);
  EXPECT_EQ(rv::type_of(rv::Released{}), MessageType::released);
  EXPECT_EQ(rv::type_of(rv::ErrorReply{}), MessageType::error);
  for (const auto& frame : samples()) {
    EXPECT_EQ(static_cast<std::uint8_t>(rv::encode_frame(frame)[4]),
              static_cast<std::uint8_t>(rv::type_of(frame.message)));
  }
}

TEST(FrameLayout, ChunkedReasonNames) {
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::budget), "budget");
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::not_configured), "not_configured");
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::below_threshold), "below_threshold");
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::draining), "draining");
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::no_offer), "no_offer");
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::backend_mismatch), "backend_mismatch");
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::registration_failed), "registration_failed");
  EXPECT_EQ(corma::to_string(rv::ChunkedReason::no_window), "no_window");
  EXPECT_EQ(corma::to_string(static_cast<rv::ChunkedReason>(0)), "unknown");
}

// ---- round trips -------------------------------------------------------------------

TEST(FrameRoundTrip, EveryMessageType) {
  std::vector<bool> seen(std::variant_size_v<rv::Message> + 1, false);
  for (const auto& frame : samples()) {
    EXPECT_TRUE(round_trips(frame)) << "request " << frame.request_id;
    seen.at(static_cast<std::size_t>(rv::type_of(frame.message))) = true;
  }
  for (std::size_t type = 1; type < seen.size(); ++type) EXPECT_TRUE(seen[type]) << "type " << type;
}

TEST(FrameRoundTrip, LargestFields) {
  EXPECT_TRUE(round_trips({1, rv::Hello{rv::protocol_version, BackendId{3}, blob(corma::max_peer_blob_size)}}));
  EXPECT_TRUE(round_trips({2, rv::HelloOk{rv::protocol_version, BackendId{1}, blob(corma::max_peer_blob_size),
                                          std::numeric_limits<std::uint32_t>::max()}}));
  EXPECT_TRUE(round_trips({3, rv::Acquire{std::string(rv::max_name_length, 'n'), true}}));
  EXPECT_TRUE(round_trips({4, rv::RdmaGrant{std::numeric_limits<std::uint64_t>::max(),
                                            std::numeric_limits<std::uint64_t>::max(),
                                            std::numeric_limits<std::uint32_t>::max(),
                                            descriptor_bytes(corma::max_packed_key_size)}}));
  EXPECT_TRUE(round_trips({5, rv::Chunked{1, 2, std::numeric_limits<std::uint32_t>::max(), 4,
                                          rv::ChunkedReason::draining}}));
  EXPECT_TRUE(round_trips({6, rv::Pull{1, std::numeric_limits<std::uint64_t>::max(),
                                       std::numeric_limits<std::uint32_t>::max()}}));
  EXPECT_TRUE(round_trips({7, rv::Data{1, blob(1 << 20)}}));
  EXPECT_TRUE(round_trips({8, rv::ErrorReply{std::numeric_limits<std::uint16_t>::max(),
                                             std::string(rv::max_detail_length, 'd')}}));
  EXPECT_TRUE(round_trips({9, rv::AcquireMany{std::vector<std::string>(rv::max_batch_objects, "n"), false}}));
  EXPECT_TRUE(round_trips({10, rv::ReleaseMany{std::vector<std::uint64_t>(rv::max_batch_objects, 7)}}));
  EXPECT_TRUE(round_trips({11, rv::ReleasedMany{std::vector<std::uint16_t>(rv::max_batch_objects, 9)}}));
  // The most grants an owner may announce, each with the largest
  // descriptor, fit one frame of the default maximum.
  rv::Granted granted;
  for (std::size_t i = 0; i < rv::max_grants_per_frame; ++i) {
    granted.grants.push_back(rv::RdmaGrant{i, 1, 2, descriptor_bytes(corma::max_packed_key_size)});
  }
  EXPECT_TRUE(round_trips({12, granted}));
  EXPECT_LE(rv::encode_frame({12, granted}).size() - 4, rv::default_max_frame_body);
}

// ---- version 2: hello_ok's batch limit and the batch frames ------------------------

TEST(FrameRefusal, HelloOkBatchLimitOutsideItsBounds) {
  for (std::uint64_t limit : {std::uint64_t{0}, std::uint64_t{rv::max_batch_objects + 1}, std::uint64_t{0xffff}}) {
    auto body = body_of({1, rv::HelloOk{2, BackendId::none, {}, 100, 64}});
    put_le(body, body.size() - 2, limit, 2);
    EXPECT_TRUE(refused(body)) << limit;
  }
}

TEST(FrameDecoding, AVersionOneHelloOkCarriesNoBatchLimit) {
  auto body = body_of({1, rv::HelloOk{1, BackendId::none, {}, 100, 0}});
  auto frame = rv::decode_frame_body(body);
  ASSERT_TRUE(frame) << frame.error().message();
  EXPECT_EQ(std::get<rv::HelloOk>(frame.value().message).max_batch, 0U);
  append_le(body, 64, 2);
  EXPECT_TRUE(refused(body)) << "a batch limit after a version 1 hello_ok is trailing bytes";
}

TEST(FrameRefusal, BatchCountsOutsideTheirBounds) {
  for (auto type : {MessageType::acquire_many, MessageType::granted, MessageType::release_many,
                    MessageType::released_many}) {
    for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{rv::max_batch_objects + 1}, std::uint64_t{0xffff}}) {
      auto body = header(static_cast<std::uint8_t>(type));
      append_le(body, count, 2);
      EXPECT_TRUE(refused(body)) << "type " << int(type) << " count " << count;
    }
  }
}

TEST(FrameRefusal, BatchCountsLongerThanTheirElements) {
  // A count that promises one element more than follows.
  auto acquire = body_of({1, rv::AcquireMany{{"a", "b"}, true}});
  put_le(acquire, payload_at, 3, 2);
  EXPECT_TRUE(refused(acquire));
  auto release = body_of({1, rv::ReleaseMany{{1, 2}}});
  put_le(release, payload_at, 3, 2);
  EXPECT_TRUE(refused(release));
  auto released = body_of({1, rv::ReleasedMany{{0, 0}}});
  put_le(released, payload_at, 3, 2);
  EXPECT_TRUE(refused(released));
  auto granted = body_of({1, rv::Granted{{rv::NotFound{}, rv::NotFound{}}}});
  put_le(granted, payload_at, 3, 2);
  EXPECT_TRUE(refused(granted));
}

TEST(FrameRefusal, AcquireManyNamesFollowTheAcquireRules) {
  auto empty = header(static_cast<std::uint8_t>(MessageType::acquire_many));
  append_le(empty, 1, 2);
  append_le(empty, 1, 1);
  append_le(empty, 0, 2);  // an empty name
  EXPECT_TRUE(refused(empty));
  auto long_name = header(static_cast<std::uint8_t>(MessageType::acquire_many));
  append_le(long_name, 1, 2);
  append_le(long_name, 1, 1);
  append_le(long_name, rv::max_name_length + 1, 2);
  long_name.insert(long_name.end(), rv::max_name_length + 1, std::byte{'n'});
  EXPECT_TRUE(refused(long_name));
  auto not_a_bool = body_of({1, rv::AcquireMany{{"a"}, true}});
  put_le(not_a_bool, payload_at + 2, 2, 1);
  EXPECT_TRUE(refused(not_a_bool));
}

TEST(FrameRefusal, GrantedCarriesOnlyAcquireAnswers) {
  for (auto type : {MessageType::hello, MessageType::hello_ok, MessageType::acquire, MessageType::pull,
                    MessageType::data, MessageType::renew, MessageType::renewed, MessageType::release,
                    MessageType::released, MessageType::acquire_many, MessageType::granted,
                    MessageType::release_many, MessageType::released_many, MessageType::next_window}) {
    auto body = body_of({1, rv::Granted{{rv::NotFound{}}}});
    put_le(body, payload_at + 2, static_cast<std::uint8_t>(type), 1);
    EXPECT_TRUE(refused(body)) << "type " << int(type);
  }
  // Each answer is checked as its own message would be.
  auto zero_chunk = body_of({1, rv::Granted{{rv::Chunked{1, 2, 3, 4, rv::ChunkedReason::budget}}}});
  put_le(zero_chunk, payload_at + 2 + 1 + 16, 0, 4);
  EXPECT_TRUE(refused(zero_chunk));
}

TEST(FrameRefusal, RdmaWindowOutsideItsObjectOrEmpty) {
  const std::uint64_t size = 10 << 20;
  struct Case {
    std::uint64_t offset;
    std::uint64_t len;
  };
  for (auto bad : {Case{0, 0}, Case{size, 1}, Case{size + 1, 0}, Case{size - 4, 5},
                   Case{1, std::numeric_limits<std::uint64_t>::max()}}) {
    auto body = body_of({1, rv::RdmaWindow{1, size, 2, 0, 1, descriptor_bytes()}});
    put_le(body, payload_at + 20, bad.offset, 8);
    put_le(body, payload_at + 28, bad.len, 8);
    EXPECT_TRUE(refused(body)) << bad.offset << " +" << bad.len;
  }
  auto empty_descriptor = body_of({1, rv::RdmaWindow{1, size, 2, 0, 1, {}}});
  EXPECT_TRUE(refused(empty_descriptor));
}

TEST(FrameEncode, BatchesOutsideTheirBoundsThrow) {
  EXPECT_THROW((void)rv::encode_frame({1, rv::AcquireMany{{}, true}}), std::length_error);
  EXPECT_THROW((void)rv::encode_frame({1, rv::ReleaseMany{std::vector<std::uint64_t>(rv::max_batch_objects + 1)}}),
               std::length_error);
}

TEST(FrameRoundTrip, EveryChunkedReason) {
  for (std::uint8_t r = 1; r <= 8; ++r) {
    EXPECT_TRUE(round_trips({r, rv::Chunked{1, 2, 3, 4, static_cast<rv::ChunkedReason>(r)}})) << int{r};
  }
}

TEST(FrameRoundTrip, GrantedDescriptorDecodes) {
  const auto bytes = rv::encode_frame({1, rv::RdmaGrant{1, 2, 3, descriptor_bytes(33)}});
  auto frame = rv::decode_frame_body(std::span(bytes).subspan(4));
  ASSERT_TRUE(frame) << frame.error().message();
  const auto& grant = std::get<rv::RdmaGrant>(frame.value().message);
  auto descriptor = corma::decode_descriptor(grant.descriptor);
  ASSERT_TRUE(descriptor) << descriptor.error().message();
  EXPECT_EQ(descriptor.value().packed_key, blob(33));
}

TEST(FrameEncode, LengthThatDoesNotFitItsFieldThrows) {
  EXPECT_THROW((void)rv::encode_frame({1, rv::Acquire{std::string(70000, 'n'), false}}), std::length_error);
  EXPECT_THROW((void)rv::encode_frame({1, rv::ErrorReply{1, std::string(70000, 'd')}}), std::length_error);
}

// ---- the length prefix -----------------------------------------------------------

TEST(FrameLength, AcceptsTheBounds) {
  std::vector<std::byte> prefix(4);
  put_le(prefix, 0, rv::frame_fixed_body, 4);
  EXPECT_EQ(rv::decode_frame_length(prefix, 100).value(), rv::frame_fixed_body);
  put_le(prefix, 0, 100, 4);
  EXPECT_EQ(rv::decode_frame_length(prefix, 100).value(), 100U);
}

TEST(FrameLength, RefusesABodyShorterThanTheFixedHeader) {
  std::vector<std::byte> prefix(4);
  for (std::uint32_t body = 0; body < rv::frame_fixed_body; ++body) {
    put_le(prefix, 0, body, 4);
    auto length = rv::decode_frame_length(prefix, rv::default_max_frame_body);
    ASSERT_FALSE(length) << body;
    EXPECT_TRUE(length.error().is(errc::protocol)) << length.error().message();
  }
}

TEST(FrameLength, RefusesABodyOverTheMaximum) {
  std::vector<std::byte> prefix(4);
  put_le(prefix, 0, 101, 4);
  auto length = rv::decode_frame_length(prefix, 100);
  ASSERT_FALSE(length);
  EXPECT_TRUE(length.error().is(errc::protocol)) << length.error().message();
  put_le(prefix, 0, 0xffffffffU, 4);
  length = rv::decode_frame_length(prefix, rv::default_max_frame_body);
  ASSERT_FALSE(length);
  EXPECT_TRUE(length.error().is(errc::protocol)) << length.error().message();
}

TEST(FrameLength, RefusesAShortPrefix) {
  const std::vector<std::byte> prefix(3, std::byte{0x20});
  auto length = rv::decode_frame_length(prefix, rv::default_max_frame_body);
  ASSERT_FALSE(length);
  EXPECT_TRUE(length.error().is(errc::protocol)) << length.error().message();
}

// ---- the fixed header --------------------------------------------------------------

TEST(FrameRefusal, UnknownType) {
  for (std::uint8_t type : {0, 14, 200, 255}) {
    EXPECT_TRUE(refused(header(type))) << int{type};
  }
}

TEST(FrameRefusal, NonZeroReservedByte) {
  auto body = body_of({1, rv::NotFound{}});
  put_le(body, 1, 1, 1);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, NonZeroReservedWord) {
  for (std::size_t at : {2, 3}) {
    auto body = body_of({1, rv::Released{}});
    put_le(body, at, 0x80, 1);
    EXPECT_TRUE(refused(body)) << at;
  }
}

TEST(FrameRefusal, ShortFixedHeader) {
  const auto body = body_of({1, rv::NotFound{}});
  ASSERT_EQ(body.size(), rv::frame_fixed_body);
  for (std::size_t n = 0; n < body.size(); ++n) {
    EXPECT_TRUE(refused(std::span(body).first(n))) << n;
  }
}

TEST(FrameRefusal, TrailingBytesAfterEveryType) {
  for (const auto& frame : samples()) {
    if (std::holds_alternative<rv::Data>(frame.message)) continue;  // its length must match; see below
    auto body = body_of(frame);
    body.push_back(std::byte{0});
    EXPECT_TRUE(refused(body)) << "request " << frame.request_id;
  }
}

TEST(FrameRoundTrip, Version5AnswersCarryTheirGeneration) {
  for (const auto& frame : generation_samples()) {
    EXPECT_TRUE(round_trips(frame)) << "request " << frame.request_id;
    if (!std::holds_alternative<rv::Granted>(frame.message)) {
      EXPECT_TRUE(rv::generation_of(frame.message).has_value()) << "request " << frame.request_id;
    }
  }
  auto decoded = rv::decode_frame_body(body_of(generation_samples().back()));
  ASSERT_TRUE(decoded) << decoded.error().message();
  const auto& grants = std::get<rv::Granted>(decoded.value().message).grants;
  std::vector<std::optional<std::uint64_t>> generations;
  for (const auto& grant : grants) generations.push_back(rv::grant_generation(grant));
  EXPECT_EQ(generations, (std::vector<std::optional<std::uint64_t>>{5, std::nullopt, 6, std::nullopt, 8}));
}

TEST(FrameRoundTrip, AnOlderSessionIsWrittenNoGeneration) {
  for (const auto& frame : generation_samples()) {
    auto older = without_generations(frame);
    EXPECT_FALSE(rv::generation_of(older.message).has_value());
    // Exactly the generations are gone: 8 bytes per answer that lends.
    const auto answers = std::holds_alternative<rv::Granted>(frame.message)
                             ? std::get<rv::Granted>(frame.message).grants.size()
                             : std::size_t{1};
    EXPECT_EQ(rv::encode_frame(frame).size() - rv::encode_frame(older).size(), 8 * answers)
        << "request " << frame.request_id;
    EXPECT_TRUE(round_trips(older)) << "request " << frame.request_id;
    auto same_version = frame;
    rv::fit_to_version(same_version.message, rv::generation_protocol_version);
    EXPECT_EQ(rv::encode_frame(same_version), rv::encode_frame(frame)) << "a version 5 session lost its generation";
  }
}

TEST(FrameRefusal, AGenerationOfZeroOrForAnAnswerThatLendsNothing) {
  // A single answer's generation is never 0.
  auto zero = body_of({1, rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes(), std::nullopt}});
  append_le(zero, 0, 8);
  EXPECT_TRUE(refused(zero));
  // In `granted`: 0 for an answer that lends, or anything else for one that does not.
  auto granted_zero = body_of({2, rv::Granted{{rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes(), std::nullopt},
                                               rv::NotFound{}}}});
  append_le(granted_zero, 0, 8);
  append_le(granted_zero, 0, 8);
  EXPECT_TRUE(refused(granted_zero));
  auto granted_not_found = body_of({3, rv::Granted{{rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes(), std::nullopt},
                                                    rv::NotFound{}}}});
  append_le(granted_not_found, 4, 8);
  append_le(granted_not_found, 4, 8);
  EXPECT_TRUE(refused(granted_not_found));
  // Fewer generations than answers are trailing bytes.
  auto short_list = body_of({4, rv::Granted{{rv::RdmaGrant{11, 1 << 20, 30000, descriptor_bytes(), std::nullopt},
                                             rv::NotFound{}}}});
  append_le(short_list, 4, 8);
  EXPECT_TRUE(refused(short_list));
}

TEST(FrameHostile, ATruncatedVersion5AnswerIsRefusedOrReadAsAnOlderOwnersAnswer) {
  for (const auto& frame : generation_samples()) {
    const auto bytes = rv::encode_frame(frame);
    const auto body = std::span(bytes).subspan(4);
    const auto older = body_of(without_generations(frame));
    for (std::size_t n = 0; n < body.size(); ++n) {
      if (n == older.size()) {
        // Cut right before the generations: what an older owner sends.
        auto decoded = rv::decode_frame_body(body.first(n));
        ASSERT_TRUE(decoded) << decoded.error().message();
        EXPECT_TRUE(corma::fuzz::same(decoded.value(), without_generations(frame)));
        continue;
      }
      ASSERT_TRUE(refused(body.first(n))) << "request " << frame.request_id << ", body prefix of " << n;
    }
  }
}

// ---- hello / hello_ok ----------------------------------------------------------------

TEST(FrameDecoding, HelloCarriesAnyBackendId) {
  // Which ids exist is the backends' business; an owner takes only an offer
  // for its own backend (the rendezvous tests check the mismatch).
  auto body = body_of({1, rv::Hello{rv::protocol_version, BackendId{1}, blob(4)}});
  put_le(body, payload_at + 2, 4, 1);
  auto frame = rv::decode_frame_body(body);
  ASSERT_TRUE(frame) << frame.error().message();
  EXPECT_EQ(std::get<rv::Hello>(frame.value().message).backend, BackendId{4});
}

TEST(FrameRefusal, HelloOfferOverTheMaximum) {
  // The whole offer is there: its size alone is refused.
  auto body = body_of({1, rv::Hello{rv::protocol_version, BackendId{1}, blob(corma::max_peer_blob_size + 1)}});
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, HelloOfferWithoutBackend) {
  auto body = body_of({1, rv::Hello{rv::protocol_version, BackendId{1}, blob(4)}});
  put_le(body, payload_at + 2, 0, 1);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, HelloOfferRunningPastTheEnd) {
  auto body = body_of({1, rv::Hello{rv::protocol_version, BackendId{1}, blob(4)}});
  put_le(body, payload_at + 3, 5, 4);
  EXPECT_TRUE(refused(body));
}

TEST(FrameDecoding, HelloOkCarriesAnyBackendId) {
  auto body = body_of({1, rv::HelloOk{rv::protocol_version, BackendId{1}, blob(4), 100}});
  put_le(body, payload_at + 2, 9, 1);
  auto frame = rv::decode_frame_body(body);
  ASSERT_TRUE(frame) << frame.error().message();
  EXPECT_EQ(std::get<rv::HelloOk>(frame.value().message).backend, BackendId{9});
}

TEST(FrameRefusal, HelloOkAnswerOverTheMaximum) {
  auto body = body_of({1, rv::HelloOk{rv::protocol_version, BackendId{1}, blob(corma::max_peer_blob_size + 1), 100}});
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, HelloOkAnswerWithoutBackend) {
  auto body = body_of({1, rv::HelloOk{rv::protocol_version, BackendId{1}, blob(4), 100}});
  put_le(body, payload_at + 2, 0, 1);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, HelloOkMissingMaxFrameBody) {
  auto body = body_of({1, rv::HelloOk{rv::protocol_version, BackendId::none, {}, 100}});
  body.resize(body.size() - 4);
  EXPECT_TRUE(refused(body));
}

// ---- acquire -----------------------------------------------------------------------

TEST(FrameRefusal, AcquireEmptyName) {
  auto body = header(static_cast<std::uint8_t>(MessageType::acquire));
  append_le(body, 0, 2);
  append_le(body, 1, 1);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, AcquireNameOverTheMaximum) {
  auto body = header(static_cast<std::uint8_t>(MessageType::acquire));
  append_le(body, rv::max_name_length + 1, 2);
  body.insert(body.end(), rv::max_name_length + 1, std::byte{'n'});
  append_le(body, 1, 1);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, AcquireWantsRdmaNotABool) {
  for (std::uint8_t wants : {2, 0x80, 0xff}) {
    auto body = body_of({1, rv::Acquire{"obj", true}});
    put_le(body, body.size() - 1, wants, 1);
    EXPECT_TRUE(refused(body)) << int{wants};
  }
}

// ---- rdma_grant ----------------------------------------------------------------------

TEST(FrameRefusal, RdmaGrantEmptyDescriptor) {
  auto body = body_of({1, rv::RdmaGrant{1, 2, 3, {}}});
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, RdmaGrantDescriptorOverTheMaximum) {
  const auto too_long = corma::descriptor_header_size + corma::max_packed_key_size + 1;
  auto body = body_of({1, rv::RdmaGrant{1, 2, 3, blob(too_long)}});
  EXPECT_TRUE(refused(body));
}

// ---- chunked -------------------------------------------------------------------------

TEST(FrameRefusal, ChunkedZeroChunkSize) {
  auto body = body_of({1, rv::Chunked{1, 2, 3, 4, rv::ChunkedReason::budget}});
  put_le(body, payload_at + 16, 0, 4);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, ChunkedUnknownReason) {
  for (std::uint8_t reason : {0, 9, 255}) {
    auto body = body_of({1, rv::Chunked{1, 2, 3, 4, rv::ChunkedReason::budget}});
    put_le(body, payload_at + 24, reason, 1);
    EXPECT_TRUE(refused(body)) << int{reason};
  }
}

// ---- pull / data ---------------------------------------------------------------------

TEST(FrameRefusal, PullOfZeroBytes) {
  auto body = body_of({1, rv::Pull{1, 2, 3}});
  put_le(body, payload_at + 16, 0, 4);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, DataLengthLongerThanTheBytes) {
  auto body = body_of({1, rv::Data{0, blob(10)}});
  put_le(body, payload_at + 8, 11, 4);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, DataLengthShorterThanTheBytes) {
  auto body = body_of({1, rv::Data{0, blob(10)}});
  put_le(body, payload_at + 8, 9, 4);
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, DataTrailingBytes) {
  auto body = body_of({1, rv::Data{0, blob(10)}});
  body.push_back(std::byte{0});
  EXPECT_TRUE(refused(body));
}

// ---- error ---------------------------------------------------------------------------

TEST(FrameRefusal, ErrorDetailOverTheMaximum) {
  auto body = body_of({1, rv::ErrorReply{1, std::string(rv::max_detail_length + 1, 'd')}});
  EXPECT_TRUE(refused(body));
}

TEST(FrameRefusal, ErrorDetailRunningPastTheEnd) {
  auto body = body_of({1, rv::ErrorReply{1, "abc"}});
  put_le(body, payload_at + 2, 4, 2);
  EXPECT_TRUE(refused(body));
}

// ---- hostile inputs in bulk ----------------------------------------------------------

TEST(FrameHostile, EveryTruncationIsRefused) {
  auto frames = samples();
  frames.push_back({99, rv::Hello{rv::protocol_version, BackendId{3}, blob(300)}});
  frames.push_back({99, rv::RdmaGrant{1, 2, 3, descriptor_bytes(corma::max_packed_key_size)}});
  for (const auto& frame : frames) {
    const auto bytes = rv::encode_frame(frame);
    const auto body = std::span(bytes).subspan(4);
    for (std::size_t n = 0; n < body.size(); ++n) {
      ASSERT_TRUE(refused(body.first(n))) << "request " << frame.request_id << ", body prefix of " << n;
    }
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      const auto check = corma::fuzz::check_frame(std::span(bytes).first(n));
      ASSERT_FALSE(check.accepted) << "request " << frame.request_id << ", frame prefix of " << n;
      ASSERT_TRUE(check.mismatch.empty()) << check.mismatch;
    }
  }
}

TEST(FrameHostile, EverySingleByteChangeIsRefusedOrConsistent) {
  // Every byte of the small samples: the frame header and every fixed
  // payload field (blobs are short here).
  std::size_t accepted = 0;
  std::size_t refused_count = 0;
  for (const auto& frame : samples()) {
    const auto original = rv::encode_frame(frame);
    for (std::size_t at = 0; at < original.size(); ++at) {
      for (unsigned value = 0; value < 256; ++value) {
        auto bytes = original;
        bytes[at] = static_cast<std::byte>(value);
        const auto check = corma::fuzz::check_frame(bytes);
        ASSERT_TRUE(check.mismatch.empty())
            << "request " << frame.request_id << ", byte " << at << " = " << value << ": " << check.mismatch;
        if (check.accepted) {
          ++accepted;
        } else {
          ++refused_count;
        }
      }
    }
  }
  EXPECT_GT(accepted, 0U);
  EXPECT_GT(refused_count, 0U);
}

TEST(FrameHostile, ChangedHeaderBytesAreRefusedExactlyWhereTheLayoutSaysSo) {
  const auto original = rv::encode_frame({5, rv::Renew{77}});
  for (std::size_t at = 0; at < rv::frame_header_size; ++at) {
    for (unsigned value = 0; value < 256; ++value) {
      if (static_cast<std::byte>(value) == original[at]) continue;
      auto bytes = original;
      bytes[at] = static_cast<std::byte>(value);
      const auto check = corma::fuzz::check_frame(bytes);
      ASSERT_TRUE(check.mismatch.empty()) << check.mismatch;
      // Only the request id is free; a changed length makes the frame
      // disagree with its body, a changed type leaves an 8-byte payload that
      // only a release, a pushed and a heartbeat_ok (the same length) accept.
      const bool free_byte = at >= 8;
      const bool same_layout = at == 4 && (value == static_cast<unsigned>(MessageType::release) ||
                                           value == static_cast<unsigned>(MessageType::pushed) ||
                                           value == static_cast<unsigned>(MessageType::heartbeat_ok));
      EXPECT_EQ(check.accepted, free_byte || same_layout) << "byte " << at << " = " << value;
    }
  }
}

TEST(FrameHostile, PushFramesRefuseWhatTheirLayoutForbids) {
  // An empty peer blob, a notify flag other than 0 or 1, and a landing
  // longer than the frame carries. A landing the frame does carry is the
  // owner's to check (it answers `protocol` and keeps the connection).
  auto empty_offer = body_of({1, rv::PushOffer{blob(4)}});
  put_le(empty_offer, payload_at, 0, 4);
  empty_offer.resize(payload_at + 4);
  EXPECT_TRUE(refused(empty_offer));
  auto push = body_of({2, rv::Push{"x", true, 5, descriptor_bytes()}});
  const std::size_t flag_at = payload_at + 2 + 1;
  ASSERT_EQ(static_cast<std::uint8_t>(push[flag_at]), 1);
  push[flag_at] = std::byte{2};
  EXPECT_TRUE(refused(push));
  auto no_landing = body_of({3, rv::Push{"x", false, 0, descriptor_bytes()}});
  no_landing.resize(payload_at + 2 + 1 + 1 + 8);
  no_landing.insert(no_landing.end(), 4, std::byte{0});
  auto framed = rv::decode_frame_body(no_landing);
  ASSERT_TRUE(framed) << framed.error().message();
  EXPECT_TRUE(std::get<rv::Push>(framed.value().message).landing.empty());
  auto overlong = no_landing;
  overlong[overlong.size() - 4] = std::byte{9};  // says 9 bytes, carries none
  EXPECT_TRUE(refused(overlong));
}

}  // namespace
