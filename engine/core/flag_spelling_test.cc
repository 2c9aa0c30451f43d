#include "engine/core/flag_spelling.h"

#include <gtest/gtest.h>

namespace ithaca {
namespace {

FlagSpelling Of(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ToAbslSpelling("ithaca-export", static_cast<int>(argv.size()), argv.data());
}

TEST(FlagSpellingTest, DashesAreTheSpellingUnderscoresStillWorkWithAWarning) {
  FlagSpelling f = Of({"ithaca-export", "ck_pt", "--source-model", "m_dir", "--max_shard_bytes=4",
                       "--out", "--dtype=bf16", "-x_y", "--", "--keep_me"});
  EXPECT_EQ(f.args, (std::vector<std::string>{"ithaca-export", "ck_pt", "--source_model", "m_dir",
                                              "--max_shard_bytes=4", "--out", "--dtype=bf16",
                                              "-x_y", "--", "--keep_me"}));
  ASSERT_EQ(f.warnings.size(), 1u);
  EXPECT_EQ(f.warnings[0],
            "ithaca-export: --max_shard_bytes is the old spelling; use --max-shard-bytes (the "
            "old one will be refused in a later release)");
  // A value's dashes stay: only the name before '=' is respelled.
  EXPECT_EQ(Of({"p", "--state-dir=/a-b/c-d"}).args[1], "--state_dir=/a-b/c-d");
  EXPECT_TRUE(Of({"p", "--state-dir=/a-b"}).warnings.empty());
}

}  // namespace
}  // namespace ithaca
