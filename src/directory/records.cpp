#include "records.hpp"

#include <boost/asio/ip/address.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>

namespace corma::directory {

namespace {

std::string family(const DirectoryConfig& config, const char* name) { return config.key_prefix + "/" + name + "/"; }

std::string with_owner(std::string key, std::string_view name, std::string_view owner) {
  key.append(name);
  key.push_back('\0');
  key.append(owner);
  return key;
}

}  // namespace

std::string owners_prefix(const DirectoryConfig& config) { return family(config, "owners"); }
std::string owner_key(const DirectoryConfig& config, std::string_view owner) {
  return owners_prefix(config) + std::string(owner);
}
std::string names_prefix(const DirectoryConfig& config) { return family(config, "names"); }
std::string name_key(const DirectoryConfig& config, std::string_view name, std::string_view owner) {
  return with_owner(names_prefix(config), name, owner);
}
std::string prefixes_prefix(const DirectoryConfig& config) { return family(config, "prefixes"); }
std::string prefix_key(const DirectoryConfig& config, std::string_view prefix, std::string_view owner) {
  return with_owner(prefixes_prefix(config), prefix, owner);
}

std::optional<NameAndOwner> split_name_key(std::string_view key, std::string_view family_prefix) {
  if (!key.starts_with(family_prefix)) return std::nullopt;
  key.remove_prefix(family_prefix.size());
  const auto nul = key.rfind('\0');
  if (nul == std::string_view::npos || nul + 1 == key.size()) return std::nullopt;
  return NameAndOwner{std::string(key.substr(0, nul)), std::string(key.substr(nul + 1))};
}

std::string encode_owner(const OwnerEntry& owner) {
  return nlohmann::json{{"host", owner.host},
                        {"port", owner.port},
                        {"machine", owner.machine},
                        {"transport", owner.transport},
                        {"protocol", owner.protocol_version},
                        {"load", owner.load}}
      .dump();
}

std::string encode_name_value(std::optional<std::uint64_t> version) {
  if (!version) return {};
  return nlohmann::json{{"version", *version}}.dump();
}

Result<std::optional<std::uint64_t>> decode_name_value(std::string_view value) {
  if (value.empty()) return std::optional<std::uint64_t>{};
  auto parsed = nlohmann::json::parse(value, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object() || parsed.size() != 1 || !parsed.contains("version") ||
      !parsed["version"].is_number_unsigned()) {
    return fail(errc::protocol, "a name's entry that is not {\"version\": a whole number}");
  }
  return std::optional<std::uint64_t>{parsed["version"].get<std::uint64_t>()};
}

namespace {

/// A whole number from 0 to `most`: not a float (1e308 is not a load), not
/// negative, not past what its field holds.
Result<std::uint64_t> whole_number(const nlohmann::json& entry, const char* field, std::uint64_t most) {
  const auto& value = entry.at(field);
  if (!value.is_number_unsigned()) return fail(errc::protocol, std::string("an owner's ") + field + " that is not a whole number");
  const auto number = value.get<std::uint64_t>();
  if (number > most) return fail(errc::protocol, std::string("an owner's ") + field + " past " + std::to_string(most));
  return number;
}

bool known_transport(std::string_view transport) {
  return transport == "tcp" || transport == "shm" || transport == "verbs" || transport == "none";
}

}  // namespace

Result<OwnerEntry> decode_owner(std::string_view id, std::string_view json) {
  auto parsed = nlohmann::json::parse(json, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return fail(errc::protocol, "an owner entry that is not a JSON object");
  OwnerEntry owner;
  try {
    owner.id = std::string(id);
    owner.host = parsed.at("host").get<std::string>();
    CORMA_TRY(const auto port, whole_number(parsed, "port", std::numeric_limits<std::uint16_t>::max()));
    owner.port = static_cast<std::uint16_t>(port);
    owner.machine = parsed.at("machine").get<std::string>();
    owner.transport = parsed.at("transport").get<std::string>();
    CORMA_TRY(const auto version, whole_number(parsed, "protocol", std::numeric_limits<std::uint16_t>::max()));
    owner.protocol_version = static_cast<std::uint16_t>(version);
    CORMA_TRY(const auto load, whole_number(parsed, "load", max_owner_load));
    owner.load = load;
  } catch (const nlohmann::json::exception& e) {
    return fail(errc::protocol, std::string("an owner entry without its fields: ") + e.what());
  }
  if (auto checked = check_owner_entry(owner); !checked) return fail(errc::protocol, checked.error().detail);
  return owner;
}

Result<void> check_owner_entry(const OwnerEntry& owner) {
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(owner.host, ec);
  if (ec) return fail(errc::out_of_range, "an owner's host is an IP address, not '" + owner.host.substr(0, 64) + "'");
  if (owner.port == 0) return fail(errc::out_of_range, "an owner's port is 1 to 65535");
  if (owner.machine.size() > max_machine_name) {
    return fail(errc::out_of_range, "an owner's machine name is at most " + std::to_string(max_machine_name) + " bytes");
  }
  if (!known_transport(owner.transport)) {
    return fail(errc::out_of_range, "an owner's transport is tcp, shm, verbs or none, not '" +
                                        owner.transport.substr(0, 32) + "'");
  }
  if (owner.protocol_version == 0) return fail(errc::out_of_range, "an owner's protocol version is at least 1");
  if (owner.load > max_owner_load) {
    return fail(errc::out_of_range, "an owner's load is at most " + std::to_string(max_owner_load));
  }
  return success();
}

Result<void> check_owner_id(std::string_view id) {
  const bool allowed = std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
  if (id.empty() || id.size() > 128 || !allowed) {
    return fail(errc::out_of_range, "an owner id is 1 to 128 letters, digits, '.', '_' or '-'");
  }
  return success();
}

}  // namespace corma::directory
