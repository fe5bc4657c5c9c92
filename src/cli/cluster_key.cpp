#include "cluster_key.hpp"

#include <corma/rendezvous.hpp>

#include <fstream>
#include <iterator>

namespace corma::cli {

Result<std::string> read_cluster_key(const std::string& file) {
  constexpr std::size_t max_key_size = 4096;
  std::ifstream in(file, std::ios::binary);
  if (!in) return fail(errc::not_configured, "cannot read the cluster key in " + file);
  std::string key;
  char c = 0;
  while (key.size() <= max_key_size && in.get(c)) key.push_back(c);
  if (in.bad()) return fail(errc::not_configured, "cannot read the cluster key in " + file);
  if (key.size() < min_cluster_key_size || key.size() > max_key_size) {
    return fail(errc::out_of_range, "the cluster key in " + file + " must be " + std::to_string(min_cluster_key_size) +
                                        " to " + std::to_string(max_key_size) + " bytes (openssl rand -hex 32 makes one)");
  }
  return key;
}

}  // namespace corma::cli
