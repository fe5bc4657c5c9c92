// Links against an installed corma::corma and uses the public API.
#include <corma/registry.hpp>

#include <cstdio>

int main() {
  corma::Error error{corma::errc::budget_exceeded, "consumer check", corma::BudgetFigures{2, 1, 2}};
  corma::Result<int> result = corma::fail(corma::errc::timeout);
  if (result || !error.retryable()) return 1;
  std::printf("consumer: linked corma; %s\n", error.message().c_str());
  return 0;
}
