// What `corma ls` prints of text from etcd: printable text as it is, every
// other byte as \xHH, and a backslash doubled so an escape cannot be forged.
#include "listing_text.hpp"

#include <gtest/gtest.h>

namespace {

using corma::cli::escaped_for_listing;

TEST(ListingText, PrintableAsciiAndWellFormedUtf8PassUnchanged) {
  EXPECT_EQ(escaped_for_listing("models/llama-7b.bin"), "models/llama-7b.bin");
  EXPECT_EQ(escaped_for_listing("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(escaped_for_listing(""), "");
}

TEST(ListingText, ControlBytesAndDeleteAreEscaped) {
  EXPECT_EQ(escaped_for_listing("a\tb\nc\rd"), "a\\x09b\\x0ac\\x0dd");
  EXPECT_EQ(escaped_for_listing("\x1b[2J\x07\x7f"), "\\x1b[2J\\x07\\x7f");
  EXPECT_EQ(escaped_for_listing(std::string_view("nul\0here", 8)), "nul\\x00here");
}

TEST(ListingText, ABackslashIsDoubledSoAnEscapeCannotBeForged) {
  EXPECT_EQ(escaped_for_listing("\\x1b"), "\\\\x1b");
  EXPECT_NE(escaped_for_listing("\\x1b"), escaped_for_listing("\x1b"));
}

TEST(ListingText, MalformedUtf8AndC1ControlsAreEscapedByteByByte) {
  EXPECT_EQ(escaped_for_listing("\xc2\x9b"), "\\xc2\\x9b") << "U+009B, a C1 control (CSI)";
  EXPECT_EQ(escaped_for_listing("\x9b"), "\\x9b") << "a lone continuation byte";
  EXPECT_EQ(escaped_for_listing("\xc3"), "\\xc3") << "a sequence cut short";
  EXPECT_EQ(escaped_for_listing("\xc0\xaf"), "\\xc0\\xaf") << "an overlong '/'";
  EXPECT_EQ(escaped_for_listing("\xe0\x80\xaf"), "\\xe0\\x80\\xaf") << "an overlong '/' in three bytes";
  EXPECT_EQ(escaped_for_listing("\xed\xa0\x80"), "\\xed\\xa0\\x80") << "a surrogate";
  EXPECT_EQ(escaped_for_listing("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80") << "past U+10FFFF";
  EXPECT_EQ(escaped_for_listing("\xc3\xa9\xff"), "\xc3\xa9\\xff");
}

}  // namespace
