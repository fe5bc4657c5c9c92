#include "rendezvous/owner/publications.hpp"

#include <algorithm>

namespace corma::rendezvous {

void Publications::publish(std::string name, PublishedObject object) {
  published_.insert_or_assign(std::move(name), Publication{std::move(object), ++last_generation_});
}

bool Publications::unpublish(std::string_view name) {
  auto it = published_.find(name);
  if (it == published_.end()) return false;
  published_.erase(it);
  return true;
}

const PublishedObject* Publications::find(std::string_view name) const {
  auto it = published_.find(name);
  return it == published_.end() ? nullptr : &it->second.object;
}

std::uint64_t Publications::publication_of(std::string_view name) const {
  auto it = published_.find(name);
  return it == published_.end() ? 0 : it->second.number;
}

std::uint64_t Publications::resolved_generation(const std::string& name, const PublishedObject& object) {
  const auto& version = object.version ? object.version : object.keepalive;
  const auto same_version = [&version](const ResolvedVersion& known) {
    // The same version, alive: compared by control block, so a new one at
    // a freed one's address is never taken for it.
    return version && !known.version.expired() && !known.version.owner_before(version) &&
           !version.owner_before(known.version);
  };
  if (auto it = resolved_.find(name); it != resolved_.end() && same_version(it->second)) {
    return it->second.generation;
  }
  const auto generation = ++last_generation_;
  if (!version) return generation;
  resolved_.insert_or_assign(name, ResolvedVersion{version, generation});
  if (resolved_.size() >= std::max<std::size_t>(2 * resolved_after_sweep_, 64)) {
    std::erase_if(resolved_, [](const auto& entry) { return entry.second.version.expired(); });
    resolved_after_sweep_ = resolved_.size();
  }
  return generation;
}

void Publications::for_each_name(const std::function<void(const std::string&)>& visit) const {
  for (const auto& [name, publication] : published_) visit(name);
}

}  // namespace corma::rendezvous
