#include <corma/error.hpp>

#include "support/run.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <system_error>

namespace {

using corma::errc;
using corma::Error;
using corma::Result;
namespace asio = boost::asio;

TEST(Errc, CategoryIsNamedCorma) {
  const std::error_code ec = errc::budget_exceeded;
  EXPECT_STREQ(ec.category().name(), "corma");
  EXPECT_EQ(&ec.category(), &corma::error_category());
}

TEST(Errc, EveryCodeHasItsOwnMessage) {
  std::set<std::string> messages;
  for (int v = 0; v <= static_cast<int>(errc::object_changed); ++v) {
    const std::error_code ec = static_cast<errc>(v);
    EXPECT_EQ(ec.message().find("unknown"), std::string::npos) << v;
    messages.insert(ec.message());
  }
  EXPECT_EQ(messages.size(), static_cast<std::size_t>(errc::object_changed) + 1);
  EXPECT_EQ(std::error_code(errc::timeout).message(), "timed out");
  EXPECT_NE(corma::error_category().message(999).find("unknown"), std::string::npos);
}

TEST(Errc, RetryableCodesAreTheTransientOnes) {
  EXPECT_TRUE(corma::is_retryable(errc::budget_exceeded));
  EXPECT_TRUE(corma::is_retryable(errc::timeout));
  EXPECT_TRUE(corma::is_retryable(errc::peer_unreachable));
  EXPECT_FALSE(corma::is_retryable(errc::invalid_key));
  EXPECT_FALSE(corma::is_retryable(errc::out_of_range));
  EXPECT_FALSE(corma::is_retryable(errc::protocol));
  EXPECT_TRUE(corma::is_retryable(errc::object_changed));
  EXPECT_FALSE(corma::is_retryable(std::make_error_code(std::errc::timed_out)));
  EXPECT_TRUE(Error(errc::budget_exceeded).retryable());
}

TEST(Error, MessageCarriesDetailAndBudgetFigures) {
  const Error e{errc::budget_exceeded, "no room", corma::BudgetFigures{8192, 4096, 10000}};
  const std::string text = e.message();
  EXPECT_NE(text.find("corma: registration budget exceeded: no room"), std::string::npos) << text;
  EXPECT_NE(text.find("requested 8192 B"), std::string::npos) << text;
  EXPECT_NE(text.find("registered 4096 B"), std::string::npos) << text;
  EXPECT_NE(text.find("10000 B budget"), std::string::npos) << text;
  EXPECT_TRUE(e.is(errc::budget_exceeded));
  EXPECT_FALSE(e.is(errc::timeout));
}

TEST(Result, ValueOnFailureThrowsSystemErrorWithTheCode) {
  Result<int> r = corma::fail(errc::invalid_key, "flipped bytes");
  ASSERT_FALSE(r);
  try {
    (void)r.value();
    FAIL() << "value() did not throw";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::error_code(errc::invalid_key));
    EXPECT_NE(std::string(e.what()).find("flipped bytes"), std::string::npos);
  }
}

TEST(Result, SuccessCarriesTheValue) {
  Result<int> r = 42;
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value(), 42);
  Result<void> v = corma::success();
  EXPECT_TRUE(v);
}

Result<int> parse_positive(int x) {
  if (x <= 0) return corma::fail(errc::out_of_range, "not positive");
  return x;
}

Result<int> doubled(int x) {
  CORMA_TRY(auto v, parse_positive(x));
  return v * 2;
}

TEST(Result, TryPropagatesTheError) {
  EXPECT_EQ(doubled(4).value(), 8);
  auto r = doubled(-1);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().is(errc::out_of_range));
  EXPECT_EQ(r.error().detail, "not positive");
}

asio::awaitable<Result<int>> async_parse(int x) { co_return parse_positive(x); }

asio::awaitable<Result<int>> sum_in_coroutine(int a, int b) {
  BOOST_OUTCOME_CO_TRY(auto x, co_await async_parse(a));
  CORMA_CO_TRY(auto y, co_await async_parse(b));
  co_return x + y;
}

TEST(Result, CoTryComposesInsideACoroutine) {
  asio::io_context io;
  EXPECT_EQ(corma::testing::run(io, sum_in_coroutine(2, 3)).value(), 5);
  auto failed = corma::testing::run(io, sum_in_coroutine(2, -3));
  ASSERT_FALSE(failed);
  EXPECT_TRUE(failed.error().is(errc::out_of_range));
}

}  // namespace
