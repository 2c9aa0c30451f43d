// The passkey eval's prompts (engine/data/passkey_prompt.h): exact length, the key sentence at a
// sentence boundary near its depth, the question and the key last, seeded keys, reproducible
// prompts, and lengths too short for the model's tokenizer refused naming the key.
#include "engine/data/passkey_prompt.h"

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/data/byte_tokenizer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string Text(const std::vector<int32_t>& t, int64_t from, int64_t to) {
  std::string s;
  for (int64_t i = from; i < to; ++i) s.push_back(static_cast<char>(t[i]));
  return s;
}

TEST(PasskeyPromptTest, ExactLengthKeyAtItsDepthAnswerLast) {
  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  const std::string key = "71432";
  const std::string sentence = " The pass key is 71432. Remember it. 71432 is the pass key.";
  for (int64_t length : {120, 500, 4096}) {
    for (double depth : {0.0, 0.1, 0.25, 0.5, 0.9, 1.0}) {
      auto p = BuildPasskeyPrompt(*tok, length, depth, key);
      ASSERT_TRUE(p.ok()) << p.status();
      const std::vector<int32_t>& t = p->tokens;
      ASSERT_EQ(static_cast<int64_t>(t.size()), length);
      EXPECT_EQ(t[0], 256) << "the byte-level BOS first";
      EXPECT_EQ(Text(t, p->key_at, p->key_at + static_cast<int64_t>(sentence.size())), sentence);
      const std::string question = " What is the pass key? The pass key is";
      EXPECT_EQ(Text(t, p->answer_at - static_cast<int64_t>(question.size()), p->answer_at),
                question);
      EXPECT_EQ(Text(t, p->answer_at, length), " 71432");
      // The key sentence at a sentence boundary of the filler (after a '.', or first) and within
      // one sentence (at most 23 bytes here) of depth x the filler.
      const int64_t before = p->key_at - 1;  // filler tokens before the key
      EXPECT_TRUE(before == 0 || t[p->key_at - 1] == '.') << length << " " << depth;
      EXPECT_LE(std::abs(static_cast<double>(before) - depth * p->filler), 23.0)
          << length << " " << depth;
      EXPECT_EQ(p->filler, length - 1 - static_cast<int64_t>(sentence.size()) -
                               static_cast<int64_t>(question.size()) - 6);
    }
  }
  // Depth 0: the key first; depth 1: the question follows the filler's last whole sentence.
  auto first = BuildPasskeyPrompt(*tok, 1000, 0, key);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->key_at, 1);
}

TEST(PasskeyPromptTest, KeysAreSeededAndPromptsReproducible) {
  EXPECT_EQ(PasskeyKey(1234, 4096, 1, 2), PasskeyKey(1234, 4096, 1, 2));
  EXPECT_EQ(PasskeyKey(1234, 4096, 1, 2).size(), 5u);
  std::set<std::string> keys;
  for (int64_t s = 0; s < 20; ++s) keys.insert(PasskeyKey(1234, 4096, 1, s));
  EXPECT_GE(keys.size(), 18u) << "the samples' keys differ";
  EXPECT_NE(PasskeyKey(1234, 4096, 1, 2), PasskeyKey(1235, 4096, 1, 2));
  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  auto a = BuildPasskeyPrompt(*tok, 777, 0.3, PasskeyKey(9, 777, 0, 0));
  auto b = BuildPasskeyPrompt(*tok, 777, 0.3, PasskeyKey(9, 777, 0, 0));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
}

TEST(PasskeyPromptTest, TooShortNamesTheKey) {
  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  auto p = BuildPasskeyPrompt(*tok, 64, 0.5, "12345");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("eval.passkey.lengths: 64 tokens cannot hold"),
            std::string::npos)
      << p.status();
}

// With a tokenizer.json (the BPE fixture): its BOS first, the exact length, the key sentence at a
// sentence boundary, and the answer the tokenizer's own tokens of " KEY".
TEST(PasskeyPromptTest, BpeTokenizerPrompts) {
  auto tok = LoadBpeTokenizer("engine/data/testdata/bpe/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto period = (*tok)->Encode(".");
  auto answer = (*tok)->Encode(" 71432");
  ASSERT_TRUE(period.ok() && answer.ok());
  for (int64_t length : {200, 1000}) {
    for (double depth : {0.0, 0.5, 1.0}) {
      auto p = BuildPasskeyPrompt(**tok, length, depth, "71432");
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_EQ(static_cast<int64_t>(p->tokens.size()), length);
      EXPECT_EQ(p->tokens[0], 0) << "<s>, the post-processor's BOS";
      EXPECT_TRUE(p->key_at == 1 || p->tokens[p->key_at - 1] == (*period)[0]) << depth;
      EXPECT_EQ(std::vector<int32_t>(p->tokens.begin() + p->answer_at, p->tokens.end()), *answer);
    }
  }
  JobSpec spec;
  spec.eval.passkey.lengths = {1000};
  EXPECT_TRUE(CheckPasskeyPrompts(spec, **tok, 1000).ok());
  absl::Status small = CheckPasskeyPrompts(spec, **tok, 300);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.message().find(", outside the model's vocabulary of 300"), std::string::npos)
      << small;
}

TEST(PasskeyPromptTest, CheckNamesTheShortestLengthThatWouldDo) {
  JobSpec spec;
  spec.eval.passkey.lengths = {4096, 100};
  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  absl::Status st = CheckPasskeyPrompts(spec, *tok, 258);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("eval.passkey.lengths: 100 tokens cannot hold a passkey prompt: its "
                              "key sentence, question and answer take 104 tokens of the model's "
                              "tokenizer (byte-level); use lengths of at least 104"),
            std::string::npos)
      << st;
  spec.eval.passkey.lengths = {4096, 104};
  EXPECT_TRUE(CheckPasskeyPrompts(spec, *tok, 258).ok());
  // A vocabulary without the byte-level BOS (256).
  st = CheckPasskeyPrompts(spec, *tok, 200);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("eval.passkey: the tokenizer's BOS 256 (byte-level) is outside the "
                              "model's vocabulary of 200"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace ithaca
