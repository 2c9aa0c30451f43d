// The passkey eval's prompts (engine/data/passkey_prompt.h): exact length, the key sentence at a
// sentence boundary near its depth, the question and the key last, seeded keys, reproducible
// prompts, and lengths too short for the model's tokenizer refused naming the key.
#include "engine/data/passkey_prompt.h"

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Multi-key prompts (eval.passkey.keys): exact length, every numbered key sentence once with
// distinct keys, the asked one at its depth, the question asking its number and its key last;
// one key is the passkey prompt itself.
TEST(PasskeyPromptTest, MultiKeyPromptHidesEveryKeyAndAsksOne) {
  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  std::set<int64_t> asked_numbers;
  for (int64_t sample = 0; sample < 8; ++sample) {
    for (double depth : {0.0, 0.5, 1.0}) {
      auto p = SamplePasskeyPrompt(*tok, 99, 4, 1000, 1, depth, sample);
      ASSERT_TRUE(p.ok()) << p.status();
      const std::vector<int32_t>& t = p->tokens;
      ASSERT_EQ(static_cast<int64_t>(t.size()), 1000);
      const std::string text = Text(t, 1, 1000);
      ASSERT_GE(p->asked, 1);
      ASSERT_LE(p->asked, 4);
      asked_numbers.insert(p->asked);
      std::set<std::string> keys;
      for (int n = 1; n <= 4; ++n) {
        const std::string head = absl::StrCat(" The pass key number ", n, " is ");
        const size_t at = text.find(head);
        ASSERT_NE(at, std::string::npos) << n << "\n" << text;
        EXPECT_EQ(text.find(head, at + 1), std::string::npos) << "once";
        const std::string key = text.substr(at + head.size(), 5);
        keys.insert(key);
        EXPECT_NE(text.find(absl::StrCat(". Remember it. ", key, " is pass key number ", n, ".")),
                  std::string::npos);
        if (n == p->asked) {
          EXPECT_EQ(key, p->key);
          EXPECT_EQ(static_cast<int64_t>(at) + 1, p->key_at) << "key_at is the asked sentence";
        }
      }
      EXPECT_EQ(keys.size(), 4u) << "distinct keys";
      const std::string question = absl::StrCat(" What is pass key number ", p->asked,
                                                "? Pass key number ", p->asked, " is");
      EXPECT_EQ(Text(t, p->answer_at - static_cast<int64_t>(question.size()), p->answer_at),
                question);
      EXPECT_EQ(Text(t, p->answer_at, 1000), " " + p->key);
      EXPECT_EQ(SamplePasskeyKey(99, 4, 1000, 1, sample), p->key);
      // The asked sentence within one filler sentence (23 bytes) plus the other key sentences
      // before it of depth x the filler.
      int64_t others_before = 0;
      for (int n = 1; n <= 4; ++n) {
        const size_t at = text.find(absl::StrCat(" The pass key number ", n, " is "));
        if (n != p->asked && static_cast<int64_t>(at) + 1 < p->key_at) {
          others_before +=
              static_cast<int64_t>(absl::StrCat(" The pass key number ", n,
                                                " is 12345. Remember it. 12345 is pass key "
                                                "number ",
                                                n, ".")
                                       .size());
        }
      }
      EXPECT_LE(std::abs(static_cast<double>(p->key_at - 1 - others_before) - depth * p->filler),
                23.0)
          << sample << " " << depth;
    }
  }
  EXPECT_GT(asked_numbers.size(), 1u) << "the asked number varies";
  // One key: the passkey prompt.
  auto one = SamplePasskeyPrompt(*tok, 99, 1, 1000, 1, 0.5, 3);
  auto same = BuildPasskeyPrompt(*tok, 1000, 0.5, PasskeyKey(99, 1000, 1, 3));
  ASSERT_TRUE(one.ok() && same.ok());
  EXPECT_EQ(one->tokens, same->tokens);
  EXPECT_EQ(one->asked, 0);
  EXPECT_EQ(SamplePasskeyKey(99, 1, 1000, 1, 3), PasskeyKey(99, 1000, 1, 3));
}

// A length that holds one key's prompt but not four keys' is refused naming the count.
TEST(PasskeyPromptTest, CheckNamesTheKeysALengthCannotHold) {
  JobSpec spec;
  spec.eval.passkey.lengths = {200};
  spec.eval.passkey.keys = {1};
  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  EXPECT_TRUE(CheckPasskeyPrompts(spec, *tok, 258).ok());
  spec.eval.passkey.keys = {1, 4};
  const absl::Status st = CheckPasskeyPrompts(spec, *tok, 258);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("eval.passkey.lengths: 200 tokens cannot hold a passkey prompt of 4 "
                              "keys: its key sentences, question and answer take "),
            std::string::npos)
      << st;
  spec.eval.passkey.lengths = {400};
  EXPECT_TRUE(CheckPasskeyPrompts(spec, *tok, 258).ok());
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
