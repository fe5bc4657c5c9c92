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

ProofMac owner_proof_mac(std::span<const std::byte> key, const ProofChallenge& challenge, std::string_view owner_id) {
  std::vector<unsigned char> message;
  message.reserve(proof_context.size() + challenge.size() + 1 + owner_id.size());
  message.insert(message.end(), proof_context.begin(), proof_context.end());
  for (auto b : challenge) message.push_back(static_cast<unsigned char>(b));
  message.push_back(static_cast<unsigned char>(owner_id.size()));
  message.insert(message.end(), owner_id.begin(), owner_id.end());
  ProofMac mac{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
       reinterpret_cast<unsigned char*>(mac.data()), &length);
  return mac;
}

bool proof_holds(std::span<const std::byte> key, const ProofChallenge& challenge, const Proof& proof) {
  if (proof.owner_id.empty() || proof.owner_id.size() > max_proof_owner_id) return false;
  const auto expected = owner_proof_mac(key, challenge, proof.owner_id);
  return CRYPTO_memcmp(expected.data(), proof.mac.data(), expected.size()) == 0;
}

}  // namespace corma::rendezvous
