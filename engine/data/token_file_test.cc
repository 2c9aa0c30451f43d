// Token files: round trip, each kind of corruption, ByteTokenize, and the DataLoader's order.
#include "engine/data/byte_tokenizer.h"
#include "engine/data/data_loader.h"
#include "engine/data/sha256.h"
#include "engine/data/token_file.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <algorithm>
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
  version[8] = 3;
  ExpectOpenError("version.tok", version, "unsupported token file version 3");

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

// Admission opens a file checking only the first and last check_limit / 2 entries (a 4 GiB file
// is not scanned inside a call); the trainer checks every one.
TEST(TokenFileTest, ABoundedCheckLooksAtTheEndsOnly) {
  std::string middle = FileBytes(Iota(1000), 258 * 4);
  const uint32_t bad = 5000;
  std::memcpy(&middle[32 + 4 * 500], &bad, 4);
  const std::string path = TmpPath("middle.tok");
  ASSERT_TRUE(WriteFileAtomic(path, middle).ok());
  EXPECT_TRUE(TokenFile::Open(path, 100).ok());  // entries 0..49 and 950..999
  absl::StatusOr<std::unique_ptr<TokenFile>> every = TokenFile::Open(path);
  ASSERT_FALSE(every.ok());
  EXPECT_NE(every.status().message().find("token 500"), std::string::npos) << every.status();
  std::string end = FileBytes(Iota(1000), 258 * 4);
  std::memcpy(&end[32 + 4 * 990], &bad, 4);
  ASSERT_TRUE(WriteFileAtomic(path, end).ok());
  absl::StatusOr<std::unique_ptr<TokenFile>> bounded = TokenFile::Open(path, 100);
  ASSERT_FALSE(bounded.ok());  // the last entries are checked
  EXPECT_NE(bounded.status().message().find("token 990"), std::string::npos) << bounded.status();
}

// ---- Version 2

TokenFileMeta SomeMeta() {
  TokenFileMeta m;
  m.vocab_size = 600;
  m.bos_id = 0;
  m.eos_id = 1;
  for (int i = 0; i < 32; ++i) m.fingerprint[i] = uint8_t(i + 1);
  m.doc_starts = {0, 4, 9};
  return m;
}

TEST(TokenFileV2Test, RoundTripWithDocumentIndexAndLossMask) {
  for (int n : {11, 12}) {  // odd: the index is padded to 8 bytes
    SCOPED_TRACE(n);
    std::string path = TmpPath("v2.tok");
    TokenFileMeta meta = SomeMeta();
    for (int i = 0; i < n; ++i) meta.loss_mask.push_back(i >= 2);
    std::vector<uint32_t> tokens = Iota(n);
    ASSERT_TRUE(WriteTokenFileV2(path, tokens, meta).ok());
    absl::StatusOr<std::string> bytes = ReadFileToString(path);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(bytes->size(), 128u + 4 * n + (n % 2) * 4 + 8 * 3 + n);
    auto f = TokenFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->version(), 2u);
    EXPECT_EQ((*f)->size(), n);
    EXPECT_EQ((*f)->vocab_size(), 600u);
    EXPECT_EQ((*f)->bos_id(), 0);
    EXPECT_EQ((*f)->eos_id(), 1);
    EXPECT_EQ((*f)->fingerprint(), meta.fingerprint);
    EXPECT_TRUE((*f)->has_fingerprint());
    EXPECT_EQ(std::vector<uint32_t>((*f)->tokens(), (*f)->tokens() + n), tokens);
    ASSERT_EQ((*f)->num_docs(), 3);
    EXPECT_EQ(std::vector<uint64_t>((*f)->doc_starts(), (*f)->doc_starts() + 3), meta.doc_starts);
    ASSERT_NE((*f)->loss_mask(), nullptr);
    EXPECT_EQ(std::vector<uint8_t>((*f)->loss_mask(), (*f)->loss_mask() + n), meta.loss_mask);
  }
}

TEST(TokenFileV2Test, WithoutLossMask) {
  std::string path = TmpPath("v2nomask.tok");
  ASSERT_TRUE(WriteTokenFileV2(path, Iota(10), SomeMeta()).ok());
  auto f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->loss_mask(), nullptr);
  EXPECT_TRUE((*f)->has_doc_index());
}

TEST(TokenFileV2Test, VersionOneHasNoIndexOrFingerprint) {
  std::string path = TmpPath("v1.tok");
  ASSERT_TRUE(WriteTokenFile(path, Iota(10), 258).ok());
  auto f = TokenFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 1u);
  EXPECT_FALSE((*f)->has_doc_index());
  EXPECT_FALSE((*f)->has_fingerprint());
  EXPECT_EQ((*f)->num_docs(), 0);
  EXPECT_EQ((*f)->bos_id(), -1);
}

TEST(TokenFileV2Test, WriteRefusesBadMetadataAndLeavesNothing) {
  std::string path = TmpPath("badmeta.tok");
  TokenFileMeta meta = SomeMeta();
  meta.doc_starts = {0, 5, 5};
  absl::Status st = WriteTokenFileV2(path, Iota(10), meta);
  EXPECT_NE(std::string(st.message()).find("document index entry 2 (5) is out of order"),
            std::string::npos)
      << st;
  meta = SomeMeta();
  meta.loss_mask = {1, 0};
  st = WriteTokenFileV2(path, Iota(10), meta);
  EXPECT_NE(std::string(st.message()).find("loss mask has 2 entries for 10 tokens"),
            std::string::npos)
      << st;
  st = WriteTokenFileV2(path, {1, 600}, SomeMeta());
  EXPECT_NE(std::string(st.message()).find("token 1 is 600, >= vocab_size 600"), std::string::npos)
      << st;
  EXPECT_FALSE(PathExists(path));
}

TEST(TokenFileV2Test, CorruptFilesAreRejectedSayingWhy) {
  TokenFileMeta meta = SomeMeta();
  meta.loss_mask.assign(10, 1);
  std::string path = TmpPath("v2good.tok");
  ASSERT_TRUE(WriteTokenFileV2(path, Iota(10), meta).ok());
  const std::string good = *ReadFileToString(path);  // 128 + 40 + 24 + 10 = 202 bytes
  ASSERT_EQ(good.size(), 202u);

  ExpectOpenError("v2short.tok", good.substr(0, 100), "shorter than the 128-byte version 2 header");
  ExpectOpenError("v2trunc.tok", good.substr(0, 201),
                  "201 bytes but its header says 10 tokens, 3 documents and a loss mask, which "
                  "need 202 bytes");
  ExpectOpenError("v2long.tok", good + "x", "203 bytes");
  std::string flags = good;
  flags[32] = 6;
  ExpectOpenError("v2flags.tok", flags, "unknown flags 0x6");
  std::string reserved = good;
  reserved[100] = 1;
  ExpectOpenError("v2reserved.tok", reserved, "reserved header byte 100 is not zero");
  std::string count = good;
  std::memset(&count[16], 0xff, 8);
  ExpectOpenError("v2count.tok", count, "impossible size");
  std::string order = good;
  uint64_t three = 3;  // entries 0, 4, 9 become 0, 4, 3
  std::memcpy(&order[128 + 40 + 16], &three, 8);
  ExpectOpenError("v2order.tok", order, "document index entry 2 is 3 after 4");
  std::string past = good;
  uint64_t ten = 10;
  std::memcpy(&past[128 + 40 + 16], &ten, 8);
  ExpectOpenError("v2past.tok", past, "document index entry 2 is 10");
  std::string mask = good;
  mask[128 + 40 + 24 + 3] = 2;
  ExpectOpenError("v2mask.tok", mask, "loss mask entry 3 is 2");
  std::string oov = good;
  uint32_t big = 600;
  std::memcpy(&oov[128 + 4 * 5], &big, 4);
  ExpectOpenError("v2oov.tok", oov, "token 5 (byte offset 148) is 600, >= the file's vocab_size");
}

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(FingerprintHex(Sha256("abc", 3)),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 56 bytes
  EXPECT_EQ(FingerprintHex(Sha256(two_blocks.data(), two_blocks.size())),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(FingerprintHex(TokenizerFingerprint{}), "byte-level");
  EXPECT_EQ(Sha256File(TmpPath("no-such-tokenizer.json")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ByteTokenMetaTest, OneDocumentPerBos) {
  std::vector<uint32_t> t = ByteTokenize("ab\n\ncd\n");
  TokenFileMeta m = ByteTokenMeta(t);
  EXPECT_EQ(m.doc_starts, (std::vector<uint64_t>{0, 4}));
  EXPECT_EQ(m.bos_id, 256);
  EXPECT_EQ(m.eos_id, -1);
  EXPECT_EQ(m.vocab_size, kByteVocab);
}

TEST(ExpandDataPathTest, GlobsAndPlainPaths) {
  std::string dir = TmpPath("glob");
  ASSERT_TRUE(MakeDirs(dir).ok());
  for (const char* n : {"b.tok", "a.tok", "c.txt"}) {
    ASSERT_TRUE(WriteFileAtomic(dir + "/" + n, "x").ok());
  }
  auto p = ExpandDataPath(dir + "/*.tok");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (std::vector<std::string>{dir + "/a.tok", dir + "/b.tok"}));
  p = ExpandDataPath(dir + "/{c.txt,b.tok}");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (std::vector<std::string>{dir + "/b.tok", dir + "/c.txt"}));
  p = ExpandDataPath(dir + "/plain.tok");  // not a pattern: Open reports a missing file
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (std::vector<std::string>{dir + "/plain.tok"}));
  p = ExpandDataPath(dir + "/*.bin");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(p.status().message()).find("*.bin: the pattern matches no file"),
            std::string::npos);
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
  DataOptions in_order;
  in_order.shuffle = false;
  auto loader = DataLoader::Create(std::move(*f), seq_len, model_vocab, in_order);
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

std::unique_ptr<TokenFile> OpenOrDie(const std::string& path) {
  auto f = TokenFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

// Three shards of 10, 7 and 3 tokens, seq_len 3: 3 + 2 + 0 windows; tokens = 100·shard + index.
std::vector<std::unique_ptr<TokenFile>> Shards(const std::string& prefix, TokenFileMeta meta) {
  std::vector<std::unique_ptr<TokenFile>> files;
  int sizes[] = {10, 7, 3};
  for (int s = 0; s < 3; ++s) {
    std::vector<uint32_t> t(sizes[s]);
    for (int i = 0; i < sizes[s]; ++i) t[i] = 100 * s + i;
    meta.doc_starts = {0, 2};
    std::string path = TmpPath(absl::StrCat(prefix, s, ".tok"));
    EXPECT_TRUE(WriteTokenFileV2(path, t, meta).ok());
    files.push_back(OpenOrDie(path));
  }
  return files;
}

TokenFileMeta ShardMeta() {
  TokenFileMeta m;
  m.vocab_size = 600;
  return m;
}

TEST(DataLoaderTest, SeveralFilesInOrderWithoutShuffle) {
  DataOptions o;
  o.shuffle = false;
  auto l = DataLoader::Create(Shards("order", ShardMeta()), 3, 1000, o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ((*l)->samples_per_epoch(), 5);
  int32_t in[3], lab[3];
  std::vector<int32_t> firsts;
  for (int s = 0; s < 6; ++s) {
    (*l)->Next(in, lab);
    firsts.push_back(in[0]);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(lab[i], in[i] + 1);
  }
  EXPECT_EQ(firsts, (std::vector<int32_t>{0, 3, 6, 100, 103, 0}));
}

TEST(DataLoaderTest, ShuffleIsAPermutationPerEpochSeededAndResumable) {
  std::vector<uint32_t> tokens = Iota(1001);
  std::string path = TmpPath("shuffle.tok");
  ASSERT_TRUE(WriteTokenFile(path, tokens, 0).ok());
  DataOptions o;
  o.seed = 42;
  auto a = DataLoader::Create(OpenOrDie(path), 10, 2000, o);
  ASSERT_TRUE(a.ok());
  const int64_t n = (*a)->samples_per_epoch();
  ASSERT_EQ(n, 100);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t p = 0; p < n; ++p) epoch0.push_back((*a)->WindowFor(p));
  for (int64_t p = n; p < 2 * n; ++p) epoch1.push_back((*a)->WindowFor(p));
  std::vector<int64_t> sorted0 = epoch0, sorted1 = epoch1, all(n);
  std::iota(all.begin(), all.end(), 0);
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  EXPECT_EQ(sorted0, all);
  EXPECT_EQ(sorted1, all);
  EXPECT_NE(epoch0, all);     // shuffled
  EXPECT_NE(epoch0, epoch1);  // a new order each epoch
  o.seed = 43;
  auto b = DataLoader::Create(OpenOrDie(path), 10, 2000, o);
  ASSERT_TRUE(b.ok());
  std::vector<int64_t> other;
  for (int64_t p = 0; p < n; ++p) other.push_back((*b)->WindowFor(p));
  EXPECT_NE(other, epoch0);  // the seed matters

  // Next serves the window WindowFor names, and a loader set to a position continues the same.
  int32_t in[10], lab[10];
  (*a)->set_position(137);
  (*a)->Next(in, lab);
  EXPECT_EQ(in[0], 10 * epoch1[37]);
  o.seed = 42;
  auto c = DataLoader::Create(OpenOrDie(path), 10, 2000, o);
  ASSERT_TRUE(c.ok());
  (*c)->set_position(137);
  int32_t in2[10], lab2[10];
  (*c)->Next(in2, lab2);
  EXPECT_EQ(std::vector<int32_t>(in, in + 10), std::vector<int32_t>(in2, in2 + 10));
}

TEST(DataLoaderTest, ExposesDocumentStartsInsideTheWindow) {
  std::string path = TmpPath("docs.tok");
  TokenFileMeta meta = ShardMeta();
  meta.doc_starts = {0, 2, 3, 7, 9};
  ASSERT_TRUE(WriteTokenFileV2(path, Iota(13), meta).ok());
  DataOptions o;
  o.shuffle = false;
  auto l = DataLoader::Create(OpenOrDie(path), 4, 1000, o);
  ASSERT_TRUE(l.ok());
  int32_t in[4], lab[4];
  (*l)->Next(in, lab);  // tokens 0..3
  EXPECT_EQ((*l)->sample_doc_starts(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ((*l)->sample_offset(), 0);
  (*l)->Next(in, lab);  // tokens 4..7
  EXPECT_EQ((*l)->sample_doc_starts(), (std::vector<int64_t>{3}));
  (*l)->Next(in, lab);  // tokens 8..11
  EXPECT_EQ((*l)->sample_doc_starts(), (std::vector<int64_t>{1}));
  EXPECT_EQ((*l)->sample_file().path(), path);
}

TEST(DataLoaderTest, DocumentMaskCutsLabelsAtDocumentEnds) {
  std::string path = TmpPath("docmask.tok");
  TokenFileMeta meta = ShardMeta();
  meta.doc_starts = {0, 2, 3, 8, 9};
  ASSERT_TRUE(WriteTokenFileV2(path, Iota(13), meta).ok());
  DataOptions o;
  o.shuffle = false;
  o.document_mask = true;
  auto l = DataLoader::Create(OpenOrDie(path), 4, 1000, o);
  ASSERT_TRUE(l.ok()) << l.status();
  int32_t in[4], lab[4];
  EXPECT_EQ((*l)->CountLabels(0), 2);
  (*l)->Next(in, lab);  // tokens 0..3: documents [0, 2), [2, 3), [3, ...
  EXPECT_EQ(std::vector<int32_t>(lab, lab + 4), (std::vector<int32_t>{1, -1, -1, 4}));
  // Tokens 4..7; token 8 (the last label) starts a document: the window's cut part [4, 8) is
  // trained up to its own end only.
  EXPECT_EQ((*l)->CountLabels(1), 3);
  (*l)->Next(in, lab);
  EXPECT_EQ(std::vector<int32_t>(lab, lab + 4), (std::vector<int32_t>{5, 6, 7, -1}));
  EXPECT_TRUE((*l)->sample_doc_starts().empty());  // one document, cut at the window's start
}

TEST(DataLoaderTest, VersionOneDocumentsComeFromTheBosId) {
  std::string path = TmpPath("v1docs.tok");
  ASSERT_TRUE(WriteTokenFile(path, {9, 1, 2, 9, 3, 4, 5, 9, 6}, 10).ok());
  DataOptions o;
  o.shuffle = false;
  o.document_mask = true;
  auto no_bos = DataLoader::Create(OpenOrDie(path), 4, 10, o);
  ASSERT_FALSE(no_bos.ok());
  EXPECT_NE(no_bos.status().message().find(path + ": data.document_mask is set but this version 1 "
                                                  "file has no document index and the model has "
                                                  "no bos_token_id"),
            std::string::npos)
      << no_bos.status();
  o.bos_id = 9;
  auto l = DataLoader::Create(OpenOrDie(path), 4, 10, o);
  ASSERT_TRUE(l.ok()) << l.status();
  int32_t in[4], lab[4];
  (*l)->Next(in, lab);  // 9 1 2 9 | labels 1 2 9 3
  EXPECT_EQ((*l)->sample_doc_starts(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(std::vector<int32_t>(lab, lab + 4), (std::vector<int32_t>{1, 2, -1, 3}));
  (*l)->Next(in, lab);  // 3 4 5 9 | labels 4 5 9 6
  EXPECT_EQ((*l)->sample_doc_starts(), (std::vector<int64_t>{3}));
  EXPECT_EQ(std::vector<int32_t>(lab, lab + 4), (std::vector<int32_t>{4, 5, -1, 6}));
}

TEST(DataLoaderTest, LossMaskIgnoresMaskedLabels) {
  std::string path = TmpPath("lossmask.tok");
  TokenFileMeta meta = ShardMeta();
  meta.doc_starts = {0, 5};
  meta.loss_mask = {0, 0, 1, 1, 1, 0, 0, 0, 1};  // prompt 0-1, completion 2-4, prompt 5-7, ...
  ASSERT_TRUE(WriteTokenFileV2(path, Iota(9), meta).ok());
  DataOptions o;
  o.shuffle = false;
  o.loss_mask = true;
  auto l = DataLoader::Create(OpenOrDie(path), 4, 1000, o);
  ASSERT_TRUE(l.ok()) << l.status();
  int32_t in[4], lab[4];
  (*l)->Next(in, lab);  // labels are tokens 1..4, masks 0 1 1 1
  EXPECT_EQ(std::vector<int32_t>(lab, lab + 4), (std::vector<int32_t>{-1, 2, 3, 4}));
  (*l)->Next(in, lab);  // labels 5..8, masks 0 0 0 1
  EXPECT_EQ(std::vector<int32_t>(lab, lab + 4), (std::vector<int32_t>{-1, -1, -1, 8}));
  EXPECT_EQ((*l)->CountLabels(0), 3);
  EXPECT_EQ((*l)->CountLabels(1), 1);

  // A file without a loss mask cannot serve data.loss_mask.
  std::string plain = TmpPath("nomask.tok");
  meta.loss_mask.clear();
  ASSERT_TRUE(WriteTokenFileV2(plain, Iota(9), meta).ok());
  auto bad = DataLoader::Create(OpenOrDie(plain), 4, 1000, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(plain + ": data.loss_mask is set but the file has no loss "
                                                "mask (make it with ithaca-tokenize --sft)"),
            std::string::npos)
      << bad.status();
}

TEST(DataLoaderTest, RejectsFilesOfAnotherTokenizerNamingBoth) {
  const std::string tokenizer = "engine/data/testdata/bpe/tokenizer.json";
  auto model_fp = Sha256File(tokenizer);
  ASSERT_TRUE(model_fp.ok()) << model_fp.status();
  DataOptions o;
  o.tokenizer_json = tokenizer;

  TokenFileMeta meta = ShardMeta();
  meta.fingerprint = *model_fp;
  auto ok = DataLoader::Create(Shards("match", meta), 3, 600, o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->warnings().empty());

  meta.fingerprint[0] ^= 1;
  auto l = DataLoader::Create(Shards("mismatch", meta), 3, 600, o);
  ASSERT_FALSE(l.ok());
  std::string msg(l.status().message());
  EXPECT_NE(msg.find(TmpPath("mismatch0.tok") + ": tokenized with tokenizer sha256 " +
                     FingerprintHex(meta.fingerprint)),
            std::string::npos)
      << msg;
  EXPECT_NE(
      msg.find("the model's tokenizer " + tokenizer + " has sha256 " + FingerprintHex(*model_fp)),
      std::string::npos)
      << msg;

  // Shards of one data set from two tokenizers.
  auto files = Shards("mixed", meta);
  std::string other = TmpPath("mixed-other.tok");
  meta.fingerprint = *model_fp;
  ASSERT_TRUE(WriteTokenFileV2(other, Iota(10), meta).ok());
  files.push_back(OpenOrDie(other));
  l = DataLoader::Create(std::move(files), 3, 600, {});
  ASSERT_FALSE(l.ok());
  EXPECT_NE(std::string(l.status().message()).find(other + ": made with tokenizer"),
            std::string::npos)
      << l.status();

  // No tokenizer.json to compare with: accepted, with a warning.
  l = DataLoader::Create(Shards("unchecked", meta), 3, 600, {});
  ASSERT_TRUE(l.ok());
  ASSERT_EQ((*l)->warnings().size(), 1u);
  EXPECT_NE((*l)->warnings()[0].find("no tokenizer.json to check it against"), std::string::npos);

  // A missing tokenizer.json is an error naming it.
  o.tokenizer_json = TmpPath("gone/tokenizer.json");
  l = DataLoader::Create(Shards("gone", meta), 3, 600, o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(std::string(l.status().message()).find("gone/tokenizer.json"), std::string::npos);
}

TEST(DataLoaderTest, IdsBeyondTheModelVocabularyAreRejected) {
  auto l = DataLoader::Create(Shards("vocab", ShardMeta()), 3, 500, {});  // files say 600
  ASSERT_FALSE(l.ok());
  EXPECT_NE(std::string(l.status().message())
                .find(TmpPath("vocab0.tok") + ": the file's vocab_size 600 exceeds the model's "
                                              "vocab_size 500"),
            std::string::npos)
      << l.status();
}

TEST(DataLoaderTest, ByteLevelFileForALargeVocabularyWarns) {
  std::string path = TmpPath("bytes-big.tok");
  std::vector<uint32_t> t = ByteTokenize("hello world\n\nagain\n");
  ASSERT_TRUE(WriteTokenFileV2(path, t, ByteTokenMeta(t)).ok());
  auto l = DataLoader::Create(OpenOrDie(path), 4, 128256, {});
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ((*l)->warnings().size(), 1u);
  EXPECT_NE((*l)->warnings()[0].find("byte-level tokens (vocab_size 258) for a model with 128256"),
            std::string::npos)
      << (*l)->warnings()[0];
  l = DataLoader::Create(OpenOrDie(path), 4, 258, {});
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE((*l)->warnings().empty());
  // With the model's own tokenizer present, a byte-level file is refused, naming the command
  // that makes the model's tokens and the key that allows bytes.
  DataOptions o;
  o.tokenizer_json = "engine/data/testdata/bpe/tokenizer.json";
  l = DataLoader::Create(OpenOrDie(path), 4, 600, o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("byte-level tokens, but the model has its own tokenizer"),
            std::string::npos)
      << l.status();
  EXPECT_NE(l.status().message().find("ithaca-tokenize --tokenizer engine/data/testdata/bpe"),
            std::string::npos)
      << l.status();
  EXPECT_NE(l.status().message().find("data.byte_tokens = true"), std::string::npos);
  // Said on purpose (data.byte_tokens): accepted, with the warning.
  o.allow_byte_tokens = true;
  l = DataLoader::Create(OpenOrDie(path), 4, 600, o);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_FALSE((*l)->warnings().empty());
  EXPECT_NE((*l)->warnings()[0].find("byte-level tokens, but the model has its own tokenizer"),
            std::string::npos);
}

TEST(DataLoaderTest, NoFileLongEnough) {
  auto files = Shards("short", ShardMeta());
  auto l = DataLoader::Create(std::move(files), 20, 1000, {});
  ASSERT_FALSE(l.ok());
  EXPECT_NE(std::string(l.status().message())
                .find("and 2 more files: no file holds one sample of seq_len + 1 = 21 tokens"),
            std::string::npos)
      << l.status();
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// One source of a mix: a file whose tokens are 1000·source + index (so a sample names its
// source), `windows` windows of seq_len 4.
std::vector<std::unique_ptr<TokenFile>> MixSource(int source, int windows) {
  std::vector<uint32_t> t(windows * 4 + 1);
  for (size_t i = 0; i < t.size(); ++i) t[i] = 1000 * source + static_cast<uint32_t>(i);
  TokenFileMeta m;
  m.vocab_size = 4000;
  m.doc_starts = {0};
  const std::string path = TmpPath(absl::StrCat("mix", source, "-", windows, ".tok"));
  EXPECT_TRUE(WriteTokenFileV2(path, t, m).ok());
  std::vector<std::unique_ptr<TokenFile>> files;
  files.push_back(OpenOrDie(path));
  return files;
}

std::unique_ptr<DataLoader> Mix(const std::vector<int64_t>& slots,
                                const std::vector<int>& windows) {
  std::vector<std::vector<std::unique_ptr<TokenFile>>> sources;
  for (size_t i = 0; i < slots.size(); ++i) sources.push_back(MixSource(i, windows[i]));
  DataOptions o;
  o.seed = 7;
  auto l = DataLoader::CreateMix(std::move(sources), slots, 4, 4000, o);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::move(*l) : nullptr;
}

// data.weights: the proportions hold exactly over every period and within one sample over every
// prefix (a fixed interleave, not random drift); each source still visits all of its windows
// once per its own epoch.
TEST(DataMixTest, ProportionsAreExactAndInterleaved) {
  auto l = Mix({3, 1}, {50, 7});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->num_sources(), 2u);
  int32_t in[4], lab[4];
  std::string order;
  int64_t count[2] = {0, 0};
  std::map<int32_t, int> seen_b;  // source B's windows by their first token
  for (int64_t n = 1; n <= 4000; ++n) {
    l->Next(in, lab);
    const int source = in[0] / 1000;
    ASSERT_TRUE(source == 0 || source == 1) << in[0];
    for (int i = 0; i < 4; ++i) EXPECT_EQ(lab[i], in[i] + 1);
    EXPECT_EQ(l->sample_file().path(), TmpPath(source == 0 ? "mix0-50.tok" : "mix1-7.tok"));
    ++count[source];
    if (n <= 8) order += source == 0 ? 'A' : 'B';
    if (source == 1 && count[1] <= 7) ++seen_b[in[0]];
    // Every prefix is within one sample of its share.
    EXPECT_LT(std::abs(count[0] - 0.75 * n), 1.0) << n;
    if (n % 4 == 0) {
      EXPECT_EQ(count[0], 3 * n / 4) << n;
    }
  }
  EXPECT_EQ(order, "AABAAABA");
  EXPECT_EQ(count[0], 3000);
  EXPECT_EQ(count[1], 1000);
  EXPECT_EQ(seen_b.size(), 7u) << "source B's first epoch visits each of its windows once";
  // Three sources, [5, 3, 2] (data.weights = [0.5, 0.3, 0.2]): exact over each period of 10.
  auto three = Mix({5, 3, 2}, {20, 20, 20});
  ASSERT_TRUE(three);
  int64_t c3[3] = {0, 0, 0};
  for (int n = 1; n <= 1000; ++n) {
    three->Next(in, lab);
    ++c3[in[0] / 1000];
    if (n % 10 == 0) {
      EXPECT_EQ(c3[0], n / 2);
      EXPECT_EQ(c3[1], 3 * n / 10);
      EXPECT_EQ(c3[2], n / 5);
    }
  }
}

// A run resumed at any position (the checkpoint's data_position) serves exactly the samples
// the uninterrupted run served from there.
TEST(DataMixTest, ResumeAtAnyPositionServesTheSameSamples) {
  auto whole = Mix({7, 3}, {13, 5});
  ASSERT_TRUE(whole);
  std::vector<std::vector<int32_t>> served;
  std::vector<std::pair<std::string, int64_t>> where;
  int32_t in[4], lab[4];
  for (int n = 0; n < 200; ++n) {
    whole->Next(in, lab);
    served.emplace_back(in, in + 4);
    where.emplace_back(whole->sample_file().path(), whole->sample_offset());
  }
  for (int64_t at : {0, 1, 9, 10, 37, 199}) {
    auto resumed = Mix({7, 3}, {13, 5});
    ASSERT_TRUE(resumed);
    resumed->set_position(at);
    for (int64_t n = at; n < 200; ++n) {
      resumed->Next(in, lab);
      ASSERT_EQ(std::vector<int32_t>(in, in + 4), served[n]) << "resumed at " << at << ", " << n;
      ASSERT_EQ(std::make_pair(resumed->sample_file().path(), resumed->sample_offset()), where[n]);
    }
    EXPECT_EQ(resumed->position(), 200);
  }
}

// data.source_loss_mask: a pretraining source (no loss mask, every label trained) mixed with an
// SFT source (its mask decides), each sample masked by its own source; a source marked SFT
// whose file has no mask is refused naming the source and the file.
TEST(DataMixTest, PretrainingAndSftSourcesEachKeepTheirOwnMask) {
  auto sources = [](bool b_has_mask) {
    std::vector<std::vector<std::unique_ptr<TokenFile>>> out;
    out.push_back(MixSource(0, 6));  // no loss mask
    std::vector<uint32_t> t(6 * 4 + 1);
    TokenFileMeta m;
    m.vocab_size = 4000;
    m.doc_starts = {0};
    for (size_t i = 0; i < t.size(); ++i) {
      t[i] = 1000 + static_cast<uint32_t>(i);
      if (b_has_mask) m.loss_mask.push_back(i % 2);  // odd tokens are completions
    }
    const std::string path = TmpPath(b_has_mask ? "mix-sft.tok" : "mix-sft-unmasked.tok");
    EXPECT_TRUE(WriteTokenFileV2(path, t, m).ok());
    std::vector<std::unique_ptr<TokenFile>> files;
    files.push_back(OpenOrDie(path));
    out.push_back(std::move(files));
    return out;
  };
  DataOptions o;
  o.shuffle = false;
  o.source_loss_mask = {false, true};
  auto l = DataLoader::CreateMix(sources(true), {1, 1}, 4, 4000, o);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE((*l)->source_masked(0));
  EXPECT_TRUE((*l)->source_masked(1));
  int32_t in[4], lab[4];
  for (int n = 0; n < 8; ++n) {
    (*l)->Next(in, lab);
    const int source = in[0] / 1000;
    ASSERT_EQ(source, n % 2) << "[1, 1] alternates A B";
    int64_t trained = 0;
    for (int i = 0; i < 4; ++i) {
      const int32_t label = in[i] + 1;
      // Source A trains every label; source B only its odd (completion) tokens.
      const bool kept = source == 0 || label % 2 == 1;
      EXPECT_EQ(lab[i], kept ? label : -1) << n << " " << i;
      trained += kept;
    }
    EXPECT_EQ((*l)->CountLabels(n), trained) << n;
  }
  EXPECT_TRUE((*l)->warnings().empty());

  // data.loss_mask = true alone still needs a mask in every source: the old error, naming A.
  DataOptions every;
  every.loss_mask = true;
  auto refused = DataLoader::CreateMix(sources(true), {1, 1}, 4, 4000, every);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("mix0-6.tok: data.loss_mask is set but the file has "
                                            "no loss mask"),
            std::string::npos)
      << refused.status();

  // A source marked SFT without a mask: an error naming the source and its file.
  auto unmasked = DataLoader::CreateMix(sources(false), {1, 1}, 4, 4000, o);
  ASSERT_FALSE(unmasked.ok());
  EXPECT_EQ(unmasked.status().message(),
            "data.source_loss_mask: source 2 (" + TmpPath("mix-sft-unmasked.tok") +
                ") is marked true (SFT: only the loss mask's tokens trained) but the file has no "
                "loss mask: make it with ithaca-tokenize --sft, or mark the source false to train "
                "every label");
  // A masked file in a source marked false trains every label, and says so.
  o.source_loss_mask = {false, false};
  auto plain = DataLoader::CreateMix(sources(true), {1, 1}, 4, 4000, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  (*plain)->Next(in, lab);
  (*plain)->Next(in, lab);
  EXPECT_EQ(std::vector<int32_t>(lab, lab + 4), (std::vector<int32_t>{1001, 1002, 1003, 1004}));
  ASSERT_EQ((*plain)->warnings().size(), 1u);
  EXPECT_NE((*plain)->warnings()[0].find("source 2 (" + TmpPath("mix-sft.tok") +
                                         ") is marked "
                                         "false, so every label is trained"),
            std::string::npos);
  // One value per source.
  o.source_loss_mask = {true};
  auto short_list = DataLoader::CreateMix(sources(true), {1, 1}, 4, 4000, o);
  ASSERT_FALSE(short_list.ok());
  EXPECT_EQ(short_list.status().message(), "data.source_loss_mask: 1 values for 2 sources");
}

TEST(DataMixTest, SourcesOfAnotherTokenizerAreRefused) {
  std::vector<std::vector<std::unique_ptr<TokenFile>>> sources;
  sources.push_back(MixSource(0, 5));
  std::vector<uint32_t> t(21, 3);
  const std::string other = TmpPath("mix-other.tok");
  ASSERT_TRUE(WriteTokenFile(other, t, 300).ok());
  std::vector<std::unique_ptr<TokenFile>> files;
  files.push_back(OpenOrDie(other));
  sources.push_back(std::move(files));
  auto l = DataLoader::CreateMix(std::move(sources), {1, 1}, 4, 4000);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("the sources of a mix must share one tokenizer"),
            std::string::npos)
      << l.status();
}

}  // namespace
}  // namespace ithaca
