// What an owner lends under each name, and the number of every version it
// lends: the objects published by name, and the generations told to
// consumers (FetchOutcome::generation), which publications and the versions
// a resolver finds draw from one counter, so that a number never names two
// versions of one name. Used on the owner's executor alone.
#pragma once

#include "rendezvous/owner/name_map.hpp"

#include <corma/owner.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace corma::rendezvous {

class Publications {
 public:
  /// Publishes `object` under `name`, in place of what was there.
  void publish(std::string name, PublishedObject object);
  /// False when nothing is published under `name`.
  bool unpublish(std::string_view name);

  /// What is published under `name`; null when nothing is.
  [[nodiscard]] const PublishedObject* find(std::string_view name) const;
  [[nodiscard]] bool contains(std::string_view name) const { return find(name) != nullptr; }

  /// The publication `name` stands for now, a number never given twice (not
  /// a per-name count: a name unpublished and published again must not come
  /// back with a number an old lease remembers); 0 when nothing is
  /// published under it. A lease remembers the one it read, so its release
  /// can tell whether the object changed meanwhile.
  [[nodiscard]] std::uint64_t publication_of(std::string_view name) const;

  /// The generation of what a resolver found for `name`: the one given
  /// before when it is the same version (the same PublishedObject::version,
  /// or keepalive, still alive), else a new one. A resolver whose answers
  /// carry neither gets a new
  /// generation per look-up: equal generations always mean the same bytes,
  /// different ones only maybe different bytes.
  std::uint64_t resolved_generation(const std::string& name, const PublishedObject& object);

  /// Calls `visit(name)` for every name published.
  void for_each_name(const std::function<void(const std::string&)>& visit) const;

 private:
  struct Publication {
    PublishedObject object;
    std::uint64_t number = 0;
  };
  /// The version of a name the resolver last found (FileResolver's kept
  /// snapshot: the same one while the file is unchanged), and the
  /// generation given to it.
  struct ResolvedVersion {
    std::weak_ptr<const void> version;  ///< PublishedObject::version, or its keepalive
    std::uint64_t generation = 0;
  };

  NameMap<Publication> published_;
  NameMap<ResolvedVersion> resolved_;
  /// Swept of versions gone when it has doubled since.
  std::size_t resolved_after_sweep_ = 0;
  std::uint64_t last_generation_ = 0;
};

}  // namespace corma::rendezvous
