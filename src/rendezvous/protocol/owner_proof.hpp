// The owner's proof (protocol version 6): a consumer holding the cluster key
// sends a fresh random challenge before its hello; the owner answers with
// its id and HMAC-SHA-256(key, context || challenge || u8 id length || id).
// The context names the protocol and its use, so that the key's MACs of
// this kind can never stand for anything else; the challenge is the
// consumer's, fresh for each connection, so a proof recorded earlier proves
// nothing now. OpenSSL computes the MAC and draws the challenge.
#pragma once

#include "rendezvous/protocol/messages.hpp"

#include <corma/error.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <string_view>

namespace corma::rendezvous {

using ProofChallenge = std::array<std::byte, proof_challenge_size>;
using ProofMac = std::array<std::byte, proof_mac_size>;

/// A challenge from OpenSSL's CSPRNG; `backend` if it has no entropy.
[[nodiscard]] Result<ProofChallenge> fresh_challenge();

/// The MAC an owner holding `key` answers `challenge` with, as `owner_id`.
[[nodiscard]] ProofMac owner_proof_mac(std::span<const std::byte> key, const ProofChallenge& challenge,
                                       std::string_view owner_id);

/// Whether `proof` answers `challenge` under `key` (compared in constant
/// time).
[[nodiscard]] bool proof_holds(std::span<const std::byte> key, const ProofChallenge& challenge, const Proof& proof);

}  // namespace corma::rendezvous
