#include "rendezvous/protocol/owner_proof.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <string>
#include <vector>

namespace corma::rendezvous {

namespace {

constexpr std::string_view proof_context = "corma owner proof, rendezvous version 6";

}  // namespace

Result<ProofChallenge> fresh_challenge() {
  ProofChallenge challenge{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(challenge.data()), static_cast<int>(challenge.size())) != 1) {
    return fail(errc::backend, "no random bytes for an owner proof's challenge");
  }
  return challenge;
}

std::string proof_endpoint(const boost::asio::ip::tcp::endpoint& endpoint) {
  auto address = endpoint.address();
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    address = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, address.to_v6());
  }
  return address.to_string() + ":" + std::to_string(endpoint.port());
}

Result<ProofMac> owner_proof_mac(std::span<const std::byte> key, const ProofChallenge& challenge,
                                 std::string_view owner_id, std::string_view endpoint) {
  if (owner_id.size() > max_proof_owner_id || endpoint.size() > 255) {
    return fail(errc::out_of_range, "an owner id or endpoint too long for a proof");
  }
  std::vector<unsigned char> message;
  message.reserve(proof_context.size() + challenge.size() + 2 + owner_id.size() + endpoint.size());
  message.insert(message.end(), proof_context.begin(), proof_context.end());
  for (auto b : challenge) message.push_back(static_cast<unsigned char>(b));
  message.push_back(static_cast<unsigned char>(owner_id.size()));
  message.insert(message.end(), owner_id.begin(), owner_id.end());
  message.push_back(static_cast<unsigned char>(endpoint.size()));
  message.insert(message.end(), endpoint.begin(), endpoint.end());
  ProofMac mac{};
  unsigned int length = 0;
  // Checked: a MAC OpenSSL failed to compute must never be compared (it
  // would be zeros, which a forger can send).
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
           reinterpret_cast<unsigned char*>(mac.data()), &length) == nullptr ||
      length != mac.size()) {
    return fail(errc::backend, "OpenSSL could not compute an owner proof's HMAC");
  }
  return mac;
}

bool proof_holds(std::span<const std::byte> key, const ProofChallenge& challenge, const Proof& proof,
                 std::string_view endpoint) {
  if (proof.owner_id.empty() || proof.owner_id.size() > max_proof_owner_id) return false;
  const auto expected = owner_proof_mac(key, challenge, proof.owner_id, endpoint);
  return expected && CRYPTO_memcmp(expected.value().data(), proof.mac.data(), proof.mac.size()) == 0;
}

}  // namespace corma::rendezvous
