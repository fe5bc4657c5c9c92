// The rendezvous descriptor: the exact wire layout,
// round trips, every refusal the decoder promises, truncations and
// single-byte corruptions.
#include <corma/descriptor.hpp>

#include "roundtrip.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace {

using corma::BackendId;
using corma::RemoteRegion;
using corma::errc;

constexpr std::size_t flags_at = 2;
constexpr std::size_t len_at = 20;
constexpr std::size_t key_len_at = 28;

std::vector<std::byte> key_of(std::size_t size, std::uint8_t seed = 1) {
  std::vector<std::byte> key(size);
  for (std::size_t i = 0; i < size; ++i) key[i] = static_cast<std::byte>((seed + i * 7) & 0xffU);
  return key;
}

RemoteRegion sample(std::size_t key_size = 24) {
  return RemoteRegion{BackendId{3}, 0x0102030405060708ULL, 0x1122334455667788ULL, 4096,
                    key_of(key_size)};
}

/// Overwrites `width` bytes at `at`, little-endian.
void put_le(std::vector<std::byte>& bytes, std::size_t at, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) bytes.at(at + i) = static_cast<std::byte>((value >> (8 * i)) & 0xffU);
}

testing::AssertionResult refused_with(const std::vector<std::byte>& bytes, errc expected) {
  auto decoded = corma::decode_descriptor(bytes);
  if (decoded) return testing::AssertionFailure() << "accepted";
  if (!decoded.error().is(expected)) {
    return testing::AssertionFailure() << "refused with " << decoded.error().message();
  }
  return testing::AssertionSuccess() << decoded.error().message();
}

TEST(DescriptorTest, LayoutIsLittleEndianFixedWidthUnpadded) {
  const auto bytes = corma::encode(RemoteRegion{BackendId{2}, 0x0102030405060708ULL,
                                              0x1112131415161718ULL, 0x2122232425262728ULL,
                                              {std::byte{0xaa}, std::byte{0xbb}}});
  const std::vector<std::uint8_t> expected = {
      1,    2,    0,    0,                                // version, backend, flags
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,    // generation
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,    // address
      0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,    // length
      2,    0,    0,    0,                                // key length
      0xaa, 0xbb};                                        // key
  ASSERT_EQ(bytes.size(), corma::descriptor_header_size + 2);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(bytes[i], static_cast<std::byte>(expected[i])) << "byte " << i;
  }
}

TEST(DescriptorTest, RoundTrips) {
  for (std::uint8_t id : {1, 2, 3}) {
    auto d = sample();
    d.backend = BackendId{id};
    auto decoded = corma::decode_descriptor(corma::encode(d));
    ASSERT_TRUE(decoded) << decoded.error().message();
    EXPECT_EQ(decoded.value(), d);
  }
}

TEST(DescriptorTest, RoundTripsExtremeValues) {
  const auto max = std::numeric_limits<std::uint64_t>::max();
  RemoteRegion d{BackendId{1}, max, max, max, key_of(1)};
  auto decoded = corma::decode_descriptor(corma::encode(d));
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_EQ(decoded.value(), d);
}

TEST(DescriptorTest, RoundTripsMaxSizeKey) {
  const auto d = sample(corma::max_packed_key_size);
  const auto bytes = corma::encode(d);
  EXPECT_EQ(bytes.size(), corma::descriptor_header_size + corma::max_packed_key_size);
  auto decoded = corma::decode_descriptor(bytes);
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_EQ(decoded.value(), d);
}

TEST(DescriptorTest, RefusesEmptyInput) { EXPECT_TRUE(refused_with({}, errc::protocol)); }

TEST(DescriptorTest, RefusesUnknownVersion) {
  for (std::uint8_t version : {0, 2, 255}) {
    auto bytes = corma::encode(sample());
    put_le(bytes, 0, version, 1);
    EXPECT_TRUE(refused_with(bytes, errc::protocol)) << "version " << int{version};
  }
}

TEST(DescriptorTest, RefusesNoBackend) {
  auto bytes = corma::encode(sample());
  put_le(bytes, 1, 0, 1);
  EXPECT_TRUE(refused_with(bytes, errc::protocol));
}

TEST(DescriptorTest, CarriesAnyBackendIdUnchanged) {
  // Which ids exist is the backends' business: the core carries any but 0.
  for (std::uint8_t backend : {1, 4, 255}) {
    auto bytes = corma::encode(sample());
    put_le(bytes, 1, backend, 1);
    auto decoded = corma::decode_descriptor(bytes);
    ASSERT_TRUE(decoded) << decoded.error().message();
    EXPECT_EQ(decoded.value().backend, BackendId{backend});
  }
}

TEST(DescriptorTest, RefusesNonZeroFlags) {
  for (unsigned bit = 0; bit < 16; ++bit) {
    auto bytes = corma::encode(sample());
    put_le(bytes, flags_at, 1U << bit, 2);
    EXPECT_TRUE(refused_with(bytes, errc::protocol)) << "flag bit " << bit;
  }
}

TEST(DescriptorTest, RefusesZeroLength) {
  auto bytes = corma::encode(sample());
  put_le(bytes, len_at, 0, 8);
  EXPECT_TRUE(refused_with(bytes, errc::protocol));
}

TEST(DescriptorTest, RefusesKeyLengthLongerThanTheBytes) {
  auto bytes = corma::encode(sample(24));
  put_le(bytes, key_len_at, 25, 4);
  EXPECT_TRUE(refused_with(bytes, errc::protocol));
}

TEST(DescriptorTest, RefusesKeyLengthShorterThanTheBytes) {
  auto bytes = corma::encode(sample(24));
  put_le(bytes, key_len_at, 23, 4);
  EXPECT_TRUE(refused_with(bytes, errc::protocol));
}

TEST(DescriptorTest, RefusesTrailingBytes) {
  auto bytes = corma::encode(sample(24));
  bytes.push_back(std::byte{0});
  EXPECT_TRUE(refused_with(bytes, errc::protocol));
}

TEST(DescriptorTest, RefusesZeroLengthKeyAsInvalidKey) {
  auto bytes = corma::encode(sample(0));
  ASSERT_EQ(bytes.size(), corma::descriptor_header_size);
  EXPECT_TRUE(refused_with(bytes, errc::invalid_key));
}

TEST(DescriptorTest, RefusesOversizedKeyAsInvalidKey) {
  // The bytes are all there: the size alone is refused.
  auto bytes = corma::encode(sample(corma::max_packed_key_size + 1));
  EXPECT_TRUE(refused_with(bytes, errc::invalid_key));
  // And a huge announced length with nothing behind it is refused the same way.
  auto header_only = corma::encode(sample(1));
  header_only.pop_back();
  put_le(header_only, key_len_at, 0xffffffffU, 4);
  EXPECT_TRUE(refused_with(header_only, errc::invalid_key));
}

TEST(DescriptorTest, EveryTruncationIsRefused) {
  for (std::size_t key_size : {std::size_t{1}, std::size_t{24}, corma::max_packed_key_size}) {
    const auto bytes = corma::encode(sample(key_size));
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      const std::vector<std::byte> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
      ASSERT_TRUE(refused_with(prefix, errc::protocol)) << "key " << key_size << ", prefix of " << n;
    }
  }
}

TEST(DescriptorTest, EverySingleByteChangeOfTheHeaderIsRefusedOrConsistent) {
  const auto original = corma::encode(sample(8));
  std::size_t accepted = 0;
  for (std::size_t at = 0; at < corma::descriptor_header_size; ++at) {
    for (unsigned value = 0; value < 256; ++value) {
      auto bytes = original;
      bytes[at] = static_cast<std::byte>(value);
      const auto check = corma::fuzz::check_descriptor(bytes);
      ASSERT_TRUE(check.mismatch.empty()) << "byte " << at << " = " << value << ": " << check.mismatch;
      if (check.accepted) ++accepted;
    }
  }
  // Accepted: version 1 only, backends 1..255, flags and key length only as
  // they were, any generation and address, any length but zero (0x1000:
  // clearing its byte 1 makes it zero).
  EXPECT_EQ(accepted, 1U + 255U + 2U + 16U * 256U + (8U * 256U - 1U) + 4U);
}

TEST(DescriptorTest, DescribeEncodesARemoteRegionThatDecodesToTheSameRegion) {
  const RemoteRegion region{BackendId{1}, 9, 0x7000, 123, key_of(40)};
  auto described = corma::describe(region);
  ASSERT_TRUE(described) << described.error().message();
  EXPECT_EQ(described.value(), corma::encode(region));
  auto decoded = corma::decode_descriptor(described.value());
  ASSERT_TRUE(decoded) << decoded.error().message();
  EXPECT_EQ(decoded.value(), region);
}

TEST(DescriptorTest, DescribeRefusesARegionWithoutBackend) {
  auto described = corma::describe(corma::RemoteRegion{BackendId::none, 1, 0x1000, 64, key_of(8)});
  ASSERT_FALSE(described);
  EXPECT_TRUE(described.error().is(errc::not_configured)) << described.error().message();
}

TEST(DescriptorTest, DescribeRefusesWhatConsumersWouldRefuse) {
  auto empty_key = corma::describe(corma::RemoteRegion{BackendId{3}, 1, 0x1000, 64, {}});
  ASSERT_FALSE(empty_key);
  EXPECT_TRUE(empty_key.error().is(errc::invalid_key)) << empty_key.error().message();

  auto big_key = corma::describe(corma::RemoteRegion{BackendId{3}, 1, 0x1000, 64, key_of(corma::max_packed_key_size + 1)});
  ASSERT_FALSE(big_key);
  EXPECT_TRUE(big_key.error().is(errc::invalid_key)) << big_key.error().message();

  auto empty_region = corma::describe(corma::RemoteRegion{BackendId{3}, 1, 0x1000, 0, key_of(8)});
  ASSERT_FALSE(empty_region);
  EXPECT_TRUE(empty_region.error().is(errc::out_of_range)) << empty_region.error().message();
}

TEST(DescriptorTest, DecodingKeepsTheBackendId) {
  for (std::uint8_t id : {1, 2, 3, 200}) {
    auto d = sample();
    d.backend = BackendId{id};
    auto decoded = corma::decode_descriptor(corma::encode(d));
    ASSERT_TRUE(decoded) << decoded.error().message();
    EXPECT_EQ(decoded.value().backend, BackendId{id});
  }
}

}  // namespace
