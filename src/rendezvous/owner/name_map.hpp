// A map keyed by object name, looked up by std::string_view without making
// a string: the owner looks every name of an acquire_many up in several of
// them, so a hash and one comparison beat a tree's dozen string compares.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace corma::rendezvous {

struct NameHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view name) const noexcept { return std::hash<std::string_view>{}(name); }
};

template <class Value>
using NameMap = std::unordered_map<std::string, Value, NameHash, std::equal_to<>>;

}  // namespace corma::rendezvous
