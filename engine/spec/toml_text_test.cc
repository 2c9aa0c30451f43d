#include "engine/spec/toml_text.h"

#include <string>

#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string Repeat(const std::string& part, int n, const std::string& sep) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? sep : "") + part;
  return out;
}

TEST(TomlTextTest, ReadsAnOrdinarySpec) {
  auto t = ParseTomlText(
      "name = \"a.b.c\"\n[data]\npath = \"x.y.tok\"\nseq_len = 8\n"
      "[training]\nlr = 1.5e-4\nmix = [1.5, 2.5, 3.5, 4.5]\n",
      "job.toml");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)["data"]["seq_len"].value<int64_t>(), 8);
}

// toml++ recursed once per part and ithacad died of SIGSEGV at 200,000 parts.
TEST(TomlTextTest, RefusesDeepDottedKeysAndHeadersBeforeParsing) {
  for (const std::string& text :
       {Repeat("a", 200000, ".") + " = 1\n", "[" + Repeat("a", 200000, ".") + "]\n",
        Repeat("\"=\"", 200000, ".") + " = 1\n", Repeat("a", 200000, " . ") + " = 1\n",
        "x = {" + Repeat("a", 200000, ".") + " = 1}\n", Repeat("a", 17, ".") + " = 1\n"}) {
    auto t = ParseTomlText(text, "job.toml");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("more than 16 parts"), std::string::npos) << t.status();
  }
  EXPECT_TRUE(ParseTomlText(Repeat("a", 16, ".") + " = 1\n", "job.toml").ok());
}

TEST(TomlTextTest, RefusesOversizedText) {
  auto t = ParseTomlText("# " + std::string(kMaxTomlBytes, 'x') + "\n", "job.toml");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("at most"), std::string::npos) << t.status();
}

TEST(TomlTextTest, ReportsSyntaxErrorsWithLineAndColumn) {
  auto t = ParseTomlText("a = 1\nb = \n", "job.toml");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("job.toml:2:"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace ithaca
