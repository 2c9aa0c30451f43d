#include "engine/data/text_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"

namespace ithaca {
namespace {

const char* kFixture = "engine/data/testdata/bpe/tokenizer.json";

TEST(TextTokenizerTest, ByteLevelIsTheBytesWithBos256) {
  std::unique_ptr<TextTokenizer> t = MakeByteTokenizer();
  auto ids = t->Encode("Hi 7.");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{'H', 'i', ' ', '7', '.'}));
  EXPECT_EQ(t->bos(), 256);
}

// The fixture (a GPT-2-style tokenizer.json) with merges that show each pre-tokenizer's splits:
// digits grouped, a space before digits, punctuation before a newline or a letter. `pattern`:
// the Split regex put before a ByteLevel without its own regex; empty: the fixture's own
// ByteLevel regex (GPT-2's).
std::string Variant(const std::string& pattern) {
  auto raw = ReadFileToString(kFixture);
  EXPECT_TRUE(raw.ok());
  nlohmann::json j = nlohmann::json::parse(*raw);
  nlohmann::json& vocab = j["model"]["vocab"];
  int next = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    next = std::max(next, it.value().get<int>() + 1);
  const std::vector<std::pair<std::string, std::string>> extra = {{"1", "2"},
                                                                  {"12", "3"},
                                                                  {"123", "4"},
                                                                  {"\xC4\xA0", "1"},
                                                                  {"\xC4\xA0"
                                                                   "1",
                                                                   "2"},
                                                                  {"7", "1"},
                                                                  {"71", "4"},
                                                                  {"\xC4\xA0", "7"},
                                                                  {"\xC4\xA0"
                                                                   "7",
                                                                   "1"},
                                                                  {".", "\xC4\x8A"},
                                                                  {"\xC4\xA0", "("},
                                                                  {"\xC4\xA0(", "y"},
                                                                  {"!", "x"},
                                                                  {"?", "?"},
                                                                  {"\xC4\xA0", "?"}};
  for (const auto& [a, b] : extra) {
    j["model"]["merges"].push_back({a, b});
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  if (!pattern.empty()) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"},
                             {"pattern", {{"Regex", pattern}}},
                             {"behavior", "Isolated"},
                             {"invert", false}},
                            {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", false}}}}};
  }
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/tokenizer.json";
  std::ofstream(path) << j.dump();
  return path;
}

const char* kText = "The pass key is 71432. Remember it.\n 1234567 is ?? the key!x (yes)";

// Expected ids: Hugging Face `tokenizers` 0.23.3 on the same tokenizer.json and text.
TEST(TextTokenizerTest, BpeMatchesHuggingFaceTokenizersForEachPattern) {
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"",
       {307, 292, 425, 486, 90, 306, 222, 606, 20,  19,  15,  222, 51, 510, 510, 67, 269, 302, 15,
        200, 222, 602, 22,  23, 24,  306, 222, 613, 261, 486, 90,  2,  89,  610, 90, 283, 10}},
      {llama3,
       {307, 292, 425, 486, 90, 306, 222, 606, 20,  19,  15,  222, 51, 510, 510, 67, 269, 302,
        609, 222, 601, 21,  22, 23,  24,  306, 222, 613, 261, 486, 90, 612, 610, 90, 283, 10}},
      {qwen2, {307, 292, 425, 486, 90,  306, 222, 24,  18,  21, 20,  19, 15, 222,
               51,  510, 510, 67,  269, 302, 609, 222, 18,  19, 20,  21, 22, 23,
               24,  306, 222, 613, 261, 486, 90,  612, 610, 90, 283, 10}},
  };
  for (const auto& [pattern, want] : cases) {
    auto t = LoadBpeTokenizer(Variant(pattern));
    ASSERT_TRUE(t.ok()) << t.status();
    auto ids = (*t)->Encode(kText);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want) << (pattern.empty() ? "GPT-2" : pattern);
  }
}

TEST(TextTokenizerTest, RefusesWhatItCannotEncode) {
  auto t = LoadBpeTokenizer(kFixture);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos(), 0);  // <s>, from the post-processor's template
  auto ids = (*t)->Encode("caf\xC3\xA9");
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("printable ASCII"), std::string::npos) << ids.status();

  auto raw = ReadFileToString(kFixture);
  ASSERT_TRUE(raw.ok());
  nlohmann::json j = nlohmann::json::parse(*raw);
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/metaspace.json";
  std::ofstream(path) << j.dump();
  auto m = LoadBpeTokenizer(path);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("Metaspace"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace ithaca
