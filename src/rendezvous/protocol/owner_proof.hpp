// The owner's proof (protocol version 6): a consumer holding the cluster key
// sends a fresh random challenge before its hello; the owner answers with
// its id and HMAC-SHA-256(key, context || challenge || u8 id length || id ||
// u8 endpoint length || endpoint), the endpoint being the address and port
// this connection reached the owner at, as each side sees it (the owner its
// socket's local end, the consumer the address it dialled). The context
// names the protocol and its use, so that the key's MACs of this kind can
// never stand for anything else; the challenge is the consumer's, fresh for
// each connection, so a proof recorded earlier proves nothing now; and the
// endpoint binds the proof to the address the consumer dialled, so that an
// impostor relaying the challenge to a real owner (elsewhere) gets a proof
// for that owner's address, not its own. OpenSSL computes the MAC and
// draws the challenge.
#pragma once

#include "rendezvous/protocol/messages.hpp"

#include <corma/error.hpp>

#include <boost/asio/ip/tcp.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace corma::rendezvous {

using ProofChallenge = std::array<std::byte, proof_challenge_size>;
using ProofMac = std::array<std::byte, proof_mac_size>;

/// A challenge from OpenSSL's CSPRNG; `backend` if it has no entropy.
[[nodiscard]] Result<ProofChallenge> fresh_challenge();

/// An endpoint as the proof binds it: "ADDRESS:PORT", an IPv4 address
/// mapped into IPv6 written as IPv4 (an owner listening on [::] sees a
/// consumer that dialled 127.0.0.1 at ::ffff:127.0.0.1).
[[nodiscard]] std::string proof_endpoint(const boost::asio::ip::tcp::endpoint& endpoint);

/// The MAC an owner holding `key` answers `challenge` with, as `owner_id`,
/// reached at `endpoint`; `backend` when OpenSSL cannot compute it.
[[nodiscard]] Result<ProofMac> owner_proof_mac(std::span<const std::byte> key, const ProofChallenge& challenge,
                                               std::string_view owner_id, std::string_view endpoint);

/// Whether `proof` answers `challenge` under `key` for an owner dialled at
/// `endpoint` (compared in constant time; false when the MAC cannot be
/// computed).
[[nodiscard]] bool proof_holds(std::span<const std::byte> key, const ProofChallenge& challenge, const Proof& proof,
                               std::string_view endpoint);

}  // namespace corma::rendezvous
