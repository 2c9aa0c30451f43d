#include "engine/core/utf8.h"

#include <gtest/gtest.h>

#include <vector>

namespace ithaca {
namespace {

TEST(Utf8Test, ValidTextIsUnchanged) {
  for (const std::string& s :
       std::vector<std::string>{"", "plain ascii", "caf\xC3\xA9", "\xE2\x82\xAC 5",
                                "\xF0\x9F\x98\x80", std::string("nul\0inside", 10)}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(ToValidUtf8(s), s);
  }
}

TEST(Utf8Test, InvalidBytesBecomeReplacementCharacters) {
  // Latin-1 "café", a lone continuation byte, an overlong '/', a surrogate, above U+10FFFF, a
  // sequence cut short by the end.
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(ToValidUtf8("caf\xE9"), "caf" + fffd);
  EXPECT_EQ(ToValidUtf8("\x80x"), fffd + "x");
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), fffd + fffd);
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(ToValidUtf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(ToValidUtf8("ab\xE2\x82"), "ab" + fffd + fffd);
  for (const std::string& s : std::vector<std::string>{"caf\xE9", "\x80", "\xC0\xAF",
                                                       "\xED\xA0\x80", "\xF8\x88\x80\x80"}) {
    EXPECT_FALSE(IsValidUtf8(s)) << s;
    EXPECT_TRUE(IsValidUtf8(ToValidUtf8(s)));
  }
}

TEST(Utf8Test, BoundedCutsAtACharacterBoundary) {
  EXPECT_EQ(BoundedUtf8("short", 10), "short");
  const std::string euros = "\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC";  // 3 x 3 bytes
  const std::string cut = BoundedUtf8(euros, 4);                     // inside the second euro
  EXPECT_EQ(cut, "\xE2\x82\xAC... (6 more bytes)");
  EXPECT_TRUE(IsValidUtf8(cut));
  const std::string big(1 << 20, 'x');
  EXPECT_LT(BoundedUtf8(big, 4096).size(), 4200u);
}

}  // namespace
}  // namespace ithaca
