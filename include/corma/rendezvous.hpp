// Types shared by the rendezvous Owner and Consumer.
#pragma once

#include <corma/error.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace corma {

/// The rendezvous protocol version this corma speaks: a consumer offers it,
/// an owner speaks it and every older one (docs/protocol.md, "Versions"),
/// and announces it in the directory.
inline constexpr std::uint16_t rendezvous_protocol_version = 6;

/// The fewest bytes a cluster key (OwnerConfig::cluster_key,
/// ConsumerConfig::cluster_key) may have.
inline constexpr std::size_t min_cluster_key_size = 16;

/// Object names are at most this long; a frame naming a longer one is
/// malformed.
inline constexpr std::size_t max_object_name_length = 4096;

/// What an object name may be, for every owner: 1..max_object_name_length
/// bytes, none of them a control character (0x00-0x1F, 0x7F; a NUL in
/// particular would end the name early for every C interface it reaches).
/// `out_of_range` for a length outside the bounds; `not_owned` for a
/// forbidden byte (an owner answers so before it looks the name up).
Result<void> check_object_name(std::string_view name);

/// Which path moved an object's bytes.
enum class Path {
  rdma,     ///< one-sided get from the owner's registered memory
  chunked,  ///< pulled in bounds-checked chunks over the control connection
};

[[nodiscard]] constexpr const char* to_string(Path path) noexcept {
  return path == Path::rdma ? "rdma" : "chunked";
}

/// Why an object came in chunks rather than over RDMA. The values up to
/// no_window are the owner's answers, as the protocol carries them
/// (docs/protocol.md); rdma_failed is the consumer's own and never travels.
enum class ChunkedReason : std::uint8_t {
  budget = 1,               ///< the owner's registration budget had no room
  not_configured = 2,       ///< the owner's backend cannot expose memory (e.g. untrusted tcp)
  below_threshold = 3,      ///< too small to be worth a registration
  draining = 4,             ///< the owner is shutting down
  no_offer = 5,             ///< the consumer made no RDMA offer, or it was not taken
  backend_mismatch = 6,     ///< the consumer offered another backend than the owner's
  registration_failed = 7,  ///< the owner's backend refused the registration
  no_window = 8,            ///< not even the smallest window fits the owner's budget
  rdma_failed = 9,          ///< RDMA was granted but the read failed; chunks finished the job
};

/// The reason's name ("no_offer"), as metrics and messages spell it.
[[nodiscard]] std::string_view to_string(ChunkedReason reason) noexcept;

/// Decisions counted by path and reason ("budget", "no_offer", ...).
struct PathCounters {
  std::uint64_t rdma = 0;
  std::map<std::string, std::uint64_t> chunked_by_reason;

  [[nodiscard]] std::uint64_t chunked() const noexcept {
    std::uint64_t n = 0;
    for (const auto& [reason, count] : chunked_by_reason) n += count;
    return n;
  }
};

}  // namespace corma
