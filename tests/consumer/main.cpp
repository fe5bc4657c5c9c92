// Links against an installed corma (and its verbs backend, when installed)
// and uses the public API.
#include <corma/registry.hpp>
#ifdef CONSUMER_WITH_VERBS
#include <corma/verbs.hpp>
#endif

#include <cstdio>

int main() {
  corma::Error error{corma::errc::budget_exceeded, "consumer check", corma::BudgetFigures{2, 1, 2}};
  corma::Result<int> result = corma::fail(corma::errc::timeout);
  if (result || !error.retryable()) return 1;
  std::printf("consumer: linked corma; %s\n", error.message().c_str());
#ifdef CONSUMER_WITH_VERBS
  // Without a device this answers not_configured and says why; with one it opens it.
  auto verbs = corma::verbs::Backend::create({});
  if (!verbs && !verbs.error().is(corma::errc::not_configured)) return 1;
  std::printf("consumer: verbs backend: %s\n",
              verbs ? verbs.value()->device_name().c_str() : verbs.error().message().c_str());
#endif
  return 0;
}
