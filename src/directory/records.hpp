// The directory's keys and values in etcd, under the configured key prefix P:
//   P/owners/<owner id>            an owner's entry: JSON (OwnerEntry)
//   P/names/<name> 0x00 <owner id>         that owner serves <name>: empty,
//                                          or {"version": N}, the version
//                                          of it the owner holds
//   P/prefixes/<prefix> 0x00 <owner id>    empty: that owner serves every
//                                          name starting with <prefix>
// all under the owner's lease. A NUL separates a name from the owner id
// because no object name holds one, so the keys of one name are exactly
// those starting with P/names/<name> 0x00.
#pragma once

#include <corma/directory.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace corma::directory {

[[nodiscard]] std::string owners_prefix(const DirectoryConfig& config);
[[nodiscard]] std::string owner_key(const DirectoryConfig& config, std::string_view owner);
[[nodiscard]] std::string names_prefix(const DirectoryConfig& config);
[[nodiscard]] std::string name_key(const DirectoryConfig& config, std::string_view name, std::string_view owner);
[[nodiscard]] std::string prefixes_prefix(const DirectoryConfig& config);
[[nodiscard]] std::string prefix_key(const DirectoryConfig& config, std::string_view prefix, std::string_view owner);

/// A name (or prefix) key without its family's prefix: the name and the owner.
struct NameAndOwner {
  std::string name;
  std::string owner;
};
[[nodiscard]] std::optional<NameAndOwner> split_name_key(std::string_view key, std::string_view family_prefix);

[[nodiscard]] std::string encode_owner(const OwnerEntry& owner);

/// A name key's value: empty when the owner says no version, else
/// {"version": N}.
[[nodiscard]] std::string encode_name_value(std::optional<std::uint64_t> version);
/// Strict: an empty value (no version) or exactly that object; anything
/// else is refused (`protocol`).
[[nodiscard]] Result<std::optional<std::uint64_t>> decode_name_value(std::string_view value);
/// Strict: anything else than an object with these fields, each passing
/// check_owner_entry(), is refused (`protocol`).
[[nodiscard]] Result<OwnerEntry> decode_owner(std::string_view id, std::string_view json);

/// The most an owner may announce as its load: a figure past it (or one
/// that is not a whole number) is not a load but an attempt to win or break
/// the ranking.
inline constexpr std::uint64_t max_owner_load = std::uint64_t{1} << 40;
inline constexpr std::size_t max_machine_name = 255;

/// What a consumer can rank and connect to: `host` an IP address, a port,
/// a machine name of at most max_machine_name bytes, a transport corma
/// knows, a protocol version it could speak, a load at most max_owner_load.
/// An owner id is checked apart (check_owner_id).
[[nodiscard]] Result<void> check_owner_entry(const OwnerEntry& owner);

/// An owner id is 1..128 bytes of [A-Za-z0-9._-] (it ends keys).
[[nodiscard]] Result<void> check_owner_id(std::string_view id);

}  // namespace corma::directory
