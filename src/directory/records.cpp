#include "records.hpp"

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

Result<OwnerEntry> decode_owner(std::string_view id, std::string_view json) {
  auto parsed = nlohmann::json::parse(json, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return fail(errc::protocol, "an owner entry that is not a JSON object");
  try {
    OwnerEntry owner;
    owner.id = std::string(id);
    owner.host = parsed.at("host").get<std::string>();
    const auto port = parsed.at("port").get<std::uint64_t>();
    if (port == 0 || port > std::numeric_limits<std::uint16_t>::max()) return fail(errc::protocol, "an owner port out of range");
    owner.port = static_cast<std::uint16_t>(port);
    owner.machine = parsed.at("machine").get<std::string>();
    owner.transport = parsed.at("transport").get<std::string>();
    owner.protocol_version = parsed.at("protocol").get<std::uint16_t>();
    owner.load = parsed.at("load").get<std::uint64_t>();
    return owner;
  } catch (const nlohmann::json::exception& e) {
    return fail(errc::protocol, std::string("an owner entry without its fields: ") + e.what());
  }
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
