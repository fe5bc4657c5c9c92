// The verbs backend's wire records: round trips, and every malformed or
// truncated record refused with the right code.
#include "wire.hpp"

#include <gtest/gtest.h>

namespace corma::verbs::wire {
namespace {

QpEndpoint sample_endpoint() {
  QpEndpoint e;
  e.qp_num = 0x123456;
  e.psn = 0xabcdef;
  e.lid = 7;
  e.has_gid = true;
  for (std::size_t i = 0; i < e.gid.size(); ++i) e.gid[i] = static_cast<std::uint8_t>(i * 13);
  e.mtu = 4096;
  return e;
}

TEST(VerbsWire, PackedKeyRoundTripsWithEveryExposedAccess) {
  for (auto access : {Access::remote_read, Access::remote_read_write, Access::remote_atomic}) {
    const RemoteKey key{0xdeadbeef, 0x7f0000001000, 12345, access};
    auto decoded = decode_key(encode_key(key));
    ASSERT_TRUE(decoded) << decoded.error().message();
    EXPECT_EQ(decoded.value().rkey, key.rkey);
    EXPECT_EQ(decoded.value().addr, key.addr);
    EXPECT_EQ(decoded.value().len, key.len);
    EXPECT_EQ(decoded.value().access, access);
  }
}

TEST(VerbsWire, APackedKeyIsTheDocumentedCvk2Record) {
  // docs/backends.md, "Packed key (CVK2)": rkey 0x1234, address
  // 0x7F0000001000, length 4096, Access::remote_atomic.
  const std::vector<std::uint8_t> documented = {
      0x43, 0x56, 0x4b, 0x32, 0x02, 0x34, 0x12, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00,
      0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x77, 0xfd, 0xa2, 0x2c, 0x9c, 0xa0, 0xa8, 0x9c};
  const auto key = encode_key({0x1234, 0x7f0000001000, 4096, Access::remote_atomic});
  ASSERT_EQ(key.size(), documented.size());
  for (std::size_t i = 0; i < key.size(); ++i) EXPECT_EQ(std::to_integer<std::uint8_t>(key[i]), documented[i]) << i;
}

TEST(VerbsWire, AVersionOneKeyFromAnOlderPeerIsInvalid) {
  // The CVK1 record (no access field) that docs/backends.md used to show.
  const std::vector<std::uint8_t> old = {0x43, 0x56, 0x4b, 0x31, 0x01, 0x34, 0x12, 0x00, 0x00, 0x00, 0x10,
                                         0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00,
                                         0x00, 0x00, 0x00, 0x0c, 0xd8, 0x6e, 0x37, 0x7e, 0x27, 0x4a, 0xf1};
  PackedKey key;
  for (auto b : old) key.push_back(std::byte{b});
  auto r = decode_key(key);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::invalid_key)) << r.error().message();
}

TEST(VerbsWire, AKeyWhoseAccessExposesNothingIsInvalidEvenWithAGoodChecksum) {
  for (unsigned value : {0U, 2U, 4U, 5U, 6U, 8U, 0xffU}) {
    auto r = decode_key(encode_key({1, 4096, 4096, static_cast<Access>(value)}));
    ASSERT_FALSE(r) << value;
    EXPECT_TRUE(r.error().is(errc::invalid_key)) << value << ": " << r.error().message();
  }
}

TEST(VerbsWire, EveryTruncationAndExtensionOfAKeyIsInvalid) {
  const auto key = encode_key({1, 4096, 4096, Access::remote_atomic});
  for (std::size_t n = 0; n < key.size(); ++n) {
    PackedKey cut(key.begin(), key.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = decode_key(cut);
    ASSERT_FALSE(r) << n;
    EXPECT_TRUE(r.error().is(errc::invalid_key)) << n << ": " << r.error().message();
  }
  auto longer = key;
  longer.push_back(std::byte{0});
  EXPECT_TRUE(decode_key(longer).error().is(errc::invalid_key));
  EXPECT_TRUE(decode_key(PackedKey(max_packed_key_size + 1)).error().is(errc::invalid_key));
}

TEST(VerbsWire, EveryFlippedByteOfAKeyIsNoticed) {
  const auto key = encode_key({0x1234, 0x7f0000001000, 4096, Access::remote_atomic});
  for (std::size_t i = 0; i < key.size(); ++i) {
    for (auto flip : {std::byte{0x01}, std::byte{0x80}}) {
      auto bad = key;
      bad[i] ^= flip;
      auto r = decode_key(bad);
      ASSERT_FALSE(r) << "flipping byte " << i << " went unnoticed";
      EXPECT_TRUE(r.error().is(errc::invalid_key));
    }
  }
}

TEST(VerbsWire, KeysWithAWrongMagicVersionOrRangeAreInvalid) {
  auto bad_magic = encode_key({1, 4096, 4096});
  bad_magic[0] ^= std::byte{1};
  EXPECT_TRUE(decode_key(bad_magic).error().is(errc::invalid_key));
  auto bad_version = encode_key({1, 4096, 4096});
  bad_version[4] = std::byte{1};
  EXPECT_TRUE(decode_key(bad_version).error().is(errc::invalid_key));
  EXPECT_TRUE(decode_key(encode_key({1, 4096, 0})).error().is(errc::invalid_key));
  EXPECT_TRUE(decode_key(encode_key({1, ~0ULL - 10, 100})).error().is(errc::invalid_key));
}

TEST(VerbsWire, EndpointRoundTrips) {
  const auto e = sample_endpoint();
  auto decoded = decode_endpoint(encode_endpoint(e));
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_EQ(decoded.value(), e);
}

TEST(VerbsWire, EveryTruncationOfAnEndpointIsAProtocolError) {
  const auto blob = encode_endpoint(sample_endpoint());
  for (std::size_t n = 0; n < blob.size(); ++n) {
    std::vector<std::byte> cut(blob.begin(), blob.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = decode_endpoint(cut);
    ASSERT_FALSE(r) << n;
    EXPECT_TRUE(r.error().is(errc::protocol)) << n;
  }
}

TEST(VerbsWire, EndpointsNoQueuePairCouldHaveAreRefused) {
  auto wide_qpn = sample_endpoint();
  wide_qpn.qp_num = 1U << 24;
  EXPECT_TRUE(decode_endpoint(encode_endpoint(wide_qpn)).error().is(errc::protocol));
  auto wide_psn = sample_endpoint();
  wide_psn.psn = 1U << 24;
  EXPECT_TRUE(decode_endpoint(encode_endpoint(wide_psn)).error().is(errc::protocol));
  auto odd_mtu = sample_endpoint();
  odd_mtu.mtu = 1500;
  EXPECT_TRUE(decode_endpoint(encode_endpoint(odd_mtu)).error().is(errc::protocol));
  auto blob = encode_endpoint(sample_endpoint());
  blob[4 + 1 + 4 + 4 + 2] = std::byte{2};  // the GID flag
  EXPECT_TRUE(decode_endpoint(blob).error().is(errc::protocol));
  EXPECT_TRUE(decode_endpoint(std::vector<std::byte>(max_peer_blob_size + 1)).error().is(errc::protocol));
}

std::vector<std::byte> bytes_of(std::initializer_list<std::uint8_t> values) {
  std::vector<std::byte> out;
  for (auto v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

TEST(VerbsWire, MessagesAreTheDocumentedCvn1AndCvr1Records) {
  // docs/backends.md, "Notifications": sequence 0x0102030405060708, tag 42;
  // its acknowledgement, queue full.
  const auto notify = bytes_of({0x43, 0x56, 0x4e, 0x31, 0x01, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03,
                                0x02, 0x01, 0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  const auto ack = bytes_of({0x43, 0x56, 0x52, 0x31, 0x01, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x01});
  EXPECT_EQ(encode_message(NotifyMessage{0x0102030405060708, 42}), notify);
  EXPECT_EQ(encode_message(AckMessage{0x0102030405060708, NotifyStatus::queue_full}), ack);
  ASSERT_EQ(notify.size(), notify_message_size);
  ASSERT_EQ(ack.size(), ack_message_size);
  auto n = decode_message(notify);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(std::get<NotifyMessage>(n.value()), (NotifyMessage{0x0102030405060708, 42}));
  auto a = decode_message(ack);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(std::get<AckMessage>(a.value()), (AckMessage{0x0102030405060708, NotifyStatus::queue_full}));
}

TEST(VerbsWire, EveryStatusRoundTripsAndNoOtherIsTaken) {
  for (auto status : {NotifyStatus::queued, NotifyStatus::queue_full, NotifyStatus::not_accepted,
                      NotifyStatus::shutting_down}) {
    auto decoded = decode_message(encode_message(AckMessage{7, status}));
    ASSERT_TRUE(decoded);
    EXPECT_EQ(std::get<AckMessage>(decoded.value()).status, status);
  }
  auto bytes = encode_message(AckMessage{7, NotifyStatus::queued});
  for (int status = 4; status < 256; ++status) {
    bytes.back() = static_cast<std::byte>(status);
    EXPECT_TRUE(decode_message(bytes).error().is(errc::protocol)) << status;
  }
}

TEST(VerbsWire, AMessageOfAnyOtherSizeMagicOrVersionIsRefused) {
  const auto notify = encode_message(NotifyMessage{1, 2});
  const auto ack = encode_message(AckMessage{1, NotifyStatus::queued});
  for (const auto& record : {notify, ack}) {
    for (std::size_t n = 0; n <= record.size() + 8; ++n) {
      if (n == record.size()) continue;
      auto resized = record;
      resized.resize(n, std::byte{0});
      auto r = decode_message(resized);
      // A cut or padded record is refused; the only other size taken is the
      // other record's, whose magic then does not match.
      ASSERT_FALSE(r) << n;
      EXPECT_TRUE(r.error().is(errc::protocol)) << n;
    }
    for (std::size_t at = 0; at < 5; ++at) {
      auto bad = record;
      bad[at] ^= std::byte{0x20};
      EXPECT_TRUE(decode_message(bad).error().is(errc::protocol)) << "byte " << at;
    }
  }
  // Each magic with the other record's size.
  auto swapped = ack;
  std::copy(notify.begin(), notify.begin() + 4, swapped.begin());
  EXPECT_TRUE(decode_message(swapped).error().is(errc::protocol));
}

}  // namespace
}  // namespace corma::verbs::wire
