// Token files: round trip, each kind of corruption, ByteTokenize, and the DataLoader's order.
#include "engine/train/token_file.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/core/file_util.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name);
}

std::vector<uint32_t> Iota(int n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

// A valid file's bytes, to corrupt.
std::string FileBytes(const std::vector<uint32_t>& tokens, uint32_t vocab) {
  std::string path = TmpPath("bytes.tok");
  EXPECT_TRUE(WriteTokenFile(path, tokens, vocab).ok());
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  EXPECT_TRUE(bytes.ok());
  return *bytes;
}

// Writes `bytes` to `name` and opens it, expecting an INVALID_ARGUMENT naming the file and
// containing `part`.
void ExpectOpenError(const std::string& name, const std::string& bytes, const std::string& part) {
  std::string path = TmpPath(name);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  auto f = TokenFile::Open(path);
  ASSERT_FALSE(f.ok()) << name << " opened";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  std::string msg(f.status().message());
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
}

TEST(TokenFileTest, WriteOpenRoundTrip) {
  std::string path = TmpPath("rt.tok");
  std::vector<uint32_t> tokens = {256, 72, 105, 10, 257, 0, 255};
  ASSERT_TRUE(WriteTokenFile(path, tokens, kByteVocab).ok());
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), 32u + 4 * tokens.size());
  EXPECT_EQ(bytes->substr(0, 8), "ITHACATK");
  EXPECT_EQ(bytes->substr(24, 8), std::string(8, '\0'));  // reserved
  EXPECT_FALSE(PathExists(absl::StrCat(path, ".tmp.", getpid())));

  auto f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->size(), 7);
  EXPECT_EQ((*f)->vocab_size(), kByteVocab);
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ(std::vector<uint32_t>((*f)->tokens(), (*f)->tokens() + 7), tokens);
}

TEST(TokenFileTest, ZeroTokensAndUnknownVocabAreValid) {
  std::string path = TmpPath("zero.tok");
  ASSERT_TRUE(WriteTokenFile(path, {}, 0).ok());
  auto f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->size(), 0);
  ASSERT_TRUE(WriteTokenFile(path, {1u << 30}, 0).ok());  // vocab 0: no bound checked
  f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tokens()[0], 1u << 30);
}

TEST(TokenFileTest, WriteRefusesOutOfVocabTokens) {
  absl::Status st = WriteTokenFile(TmpPath("bad.tok"), {1, 2, 300}, 258);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("token 2 is 300"), std::string::npos) << st;
  EXPECT_FALSE(PathExists(TmpPath("bad.tok")));
}

TEST(TokenFileTest, MissingFile) {
  auto f = TokenFile::Open(TmpPath("nope.tok"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(f.status().message()).find("nope.tok"), std::string::npos);
}

TEST(TokenFileTest, CorruptFilesAreRejectedSayingWhy) {
  const std::string good = FileBytes(Iota(10), 258);
  ExpectOpenError("empty.tok", "", "empty file");
  ExpectOpenError("short.tok", good.substr(0, 20), "20 bytes, shorter than the 32-byte header");

  std::string magic = good;
  magic[0] = 'X';
  ExpectOpenError("magic.tok", magic, "bad magic");

  std::string version = good;
  version[8] = 2;
  ExpectOpenError("version.tok", version, "unsupported token file version 2");

  ExpectOpenError("truncated.tok", good.substr(0, good.size() - 4),
                  "68 bytes but its header says 10 tokens, which need 72 bytes");
  ExpectOpenError("odd.tok", good + "x", "73 bytes but its header says 10 tokens");
  std::string huge = good;
  std::memset(&huge[16], 0xff, 8);  // count 2^64 - 1
  ExpectOpenError("huge.tok", huge, "impossible size");

  std::string oov = good;
  uint32_t bad = 258;
  std::memcpy(&oov[32 + 4 * 7], &bad, 4);
  ExpectOpenError("oov.tok", oov, "token 7 (byte offset 60) is 258, >= the file's vocab_size 258");
}

TEST(ByteTokenizeTest, TwoDocuments) {
  std::vector<uint32_t> t = ByteTokenize("\nHi\nyo\n\n \n\nOk");
  std::vector<uint32_t> want = {kByteBos, 'H', 'i', '\n', 'y', 'o', '\n', kByteBos, 'O', 'k'};
  EXPECT_EQ(t, want);
  EXPECT_TRUE(ByteTokenize("").empty());
  EXPECT_TRUE(ByteTokenize("\n\n  \n").empty());
  // Bytes above 127 (UTF-8) are tokens 128..255, not negative chars.
  EXPECT_EQ(ByteTokenize("\xc3\xa9"), (std::vector<uint32_t>{kByteBos, 0xc3, 0xa9}));
}

std::unique_ptr<DataLoader> MakeLoader(const std::vector<uint32_t>& tokens, int64_t seq_len,
                                       uint32_t file_vocab = 0, int64_t model_vocab = 1000) {
  std::string path = TmpPath("loader.tok");
  EXPECT_TRUE(WriteTokenFile(path, tokens, file_vocab).ok());
  auto f = TokenFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  auto loader = DataLoader::Create(std::move(*f), seq_len, model_vocab);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return loader.ok() ? std::move(*loader) : nullptr;
}

TEST(DataLoaderTest, OrderShiftedLabelsAndWrapAround) {
  // 11 tokens, seq_len 3: windows start at 0, 3, 6 (the one at 9 would need token 12).
  auto loader = MakeLoader(Iota(11), 3);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->samples_per_epoch(), 3);
  EXPECT_EQ(loader->seq_len(), 3);
  int32_t in[3], lab[3];
  std::vector<std::vector<int32_t>> want_in = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {0, 1, 2}};
  for (int s = 0; s < 4; ++s) {
    loader->Next(in, lab);
    EXPECT_EQ(std::vector<int32_t>(in, in + 3), want_in[s]) << "sample " << s;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(lab[i], in[i] + 1) << "sample " << s;
    EXPECT_EQ(loader->position(), s + 1);
  }
}

TEST(DataLoaderTest, ExactlyOneSample) {
  auto loader = MakeLoader(Iota(4), 3);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->samples_per_epoch(), 1);
  int32_t in[3], lab[3];
  loader->Next(in, lab);
  loader->Next(in, lab);
  EXPECT_EQ(in[0], 0);
  EXPECT_EQ(lab[2], 3);
}

TEST(DataLoaderTest, SetPositionResumesExactly) {
  std::vector<uint32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 7919) % 997;
  auto a = MakeLoader(tokens, 16);
  ASSERT_NE(a, nullptr);
  int32_t in[16], lab[16];
  for (int i = 0; i < 70; ++i) a->Next(in, lab);  // past one epoch (62 samples)
  const int64_t saved = a->position();
  std::vector<int32_t> next_a;
  for (int i = 0; i < 5; ++i) {
    a->Next(in, lab);
    next_a.insert(next_a.end(), in, in + 16);
    next_a.insert(next_a.end(), lab, lab + 16);
  }
  auto b = MakeLoader(tokens, 16);
  ASSERT_NE(b, nullptr);
  b->set_position(saved);
  std::vector<int32_t> next_b;
  for (int i = 0; i < 5; ++i) {
    b->Next(in, lab);
    next_b.insert(next_b.end(), in, in + 16);
    next_b.insert(next_b.end(), lab, lab + 16);
  }
  EXPECT_EQ(b->position(), saved + 5);
  EXPECT_EQ(next_a, next_b);
}

TEST(DataLoaderTest, CreateErrors) {
  std::string path = TmpPath("few.tok");
  ASSERT_TRUE(WriteTokenFile(path, Iota(5), 258).ok());
  auto f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok());
  auto l = DataLoader::Create(std::move(*f), 5, 258);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(l.status().message()),
            path + ": 5 tokens, too short for one sample of seq_len + 1 = 6 tokens");

  f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok());
  l = DataLoader::Create(std::move(*f), 2, 100);  // file vocab 258 > model vocab 100
  ASSERT_FALSE(l.ok());
  EXPECT_NE(std::string(l.status().message()).find("vocab_size 258 exceeds the model's"),
            std::string::npos)
      << l.status();

  ASSERT_TRUE(WriteTokenFile(path, {1, 2, 3, 50, 4}, 0).ok());  // vocab unknown: scanned
  f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok());
  l = DataLoader::Create(std::move(*f), 2, 50);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(std::string(l.status().message()).find("token 3 is 50, >= the model's vocab_size 50"),
            std::string::npos)
      << l.status();
}

}  // namespace
}  // namespace ithaca
