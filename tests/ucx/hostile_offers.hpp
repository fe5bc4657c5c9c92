// Peer offers a hostile or confused consumer could put in its hello: every
// one must be refused (`protocol`) by a UCX target before any byte of it
// reaches UCX. Needs backends/ucx on the include path (the wire records).
#pragma once

#include <corma/backend.hpp>

#include "wire.hpp"

#include <cstddef>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace corma::testing {

struct HostileOffer {
  std::string what;
  std::vector<std::byte> bytes;
};

/// `worker_address_blob` is a real UCX worker address in corma's old offer
/// framing (the answer record): what a consumer of the previous design sent.
inline std::vector<HostileOffer> hostile_offers(const std::vector<std::byte>& worker_address_blob) {
  const auto valid = ucx::wire::encode_offer();
  auto with = [&valid](std::size_t at, std::byte value) {
    auto bytes = valid;
    bytes[at] = value;
    return bytes;
  };
  std::vector<HostileOffer> offers = {
      {"empty", {}},
      {"zeroed", std::vector<std::byte>(valid.size())},
      {"zeroed, long", std::vector<std::byte>(64)},
      {"version 0", with(4, std::byte{0})},
      {"version 2", with(4, std::byte{2})},
      {"version 255", with(4, std::byte{0xFF})},
      {"unknown magic", with(3, std::byte{'2'})},
      {"a packed key's magic", with(2, std::byte{'K'})},
      {"old-style worker address", worker_address_blob},
      // The offer that aborted the process inside ucp_address_unpack: well
      // framed, with a malformed worker address inside.
      {"old-style malformed address", ucx::wire::encode_address(7, std::vector<std::byte>(40, std::byte{7}))},
  };
  auto oversized = valid;
  oversized.resize(max_peer_blob_size + 1);
  offers.push_back({"oversized", std::move(oversized)});
  for (std::size_t n = 1; n < valid.size(); ++n) {
    offers.push_back({"truncated to " + std::to_string(n), {valid.begin(), valid.begin() + static_cast<long>(n)}});
  }
  auto trailing = valid;
  trailing.push_back(std::byte{0});
  offers.push_back({"trailing byte", std::move(trailing)});
  std::mt19937 rng(11);
  for (int i = 0; i < 100; ++i) {
    std::vector<std::byte> noise(1 + rng() % 128);
    for (auto& b : noise) b = static_cast<std::byte>(rng());
    offers.push_back({"random " + std::to_string(i), std::move(noise)});
  }
  return offers;
}

}  // namespace corma::testing
