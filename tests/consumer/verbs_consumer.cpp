// Links against an installed corma::verbs. Without a device the backend
// answers not_configured and says why; with one it opens it.
#include <corma/verbs.hpp>

#include <cstdio>

int main() {
  auto verbs = corma::verbs::Backend::create({});
  if (!verbs && !verbs.error().is(corma::errc::not_configured)) {
    std::fprintf(stderr, "verbs consumer: unexpected error: %s\n", verbs.error().message().c_str());
    return 1;
  }
  std::printf("verbs consumer: %s\n",
              verbs ? ("opened " + verbs.value()->device_name()).c_str() : verbs.error().message().c_str());
  return 0;
}
