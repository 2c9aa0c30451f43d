// Tests for the safetensors reader and writer: round trips, sharding, and corrupt inputs.
#include "engine/model/safetensors.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/file_util.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

std::string TmpDir(const std::string& name) {
  std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool NoTempFiles(const std::string& dir) {
  for (const std::string& n : ListDir(dir)) {
    if (n.find(".tmp.") != std::string::npos) return false;
  }
  return true;
}

void ExpectErrorImpl(const absl::Status& st, absl::StatusCode code,
                     std::initializer_list<std::string> needles) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st;
  const std::string msg(st.message());
  for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << n << ": " << st;
}

// A macro, so a failure also reports the caller's line.
#define EXPECT_ERROR(...)                     \
  do {                                        \
    SCOPED_TRACE("EXPECT_ERROR called here"); \
    ExpectErrorImpl(__VA_ARGS__);             \
  } while (0)

// The status of opening `path`.
absl::Status OpenStatus(const std::string& path) { return SafetensorsReader::Open(path).status(); }

// A raw safetensors file: 8-byte length, `header` verbatim, then `data`.
std::string RawFile(const std::string& header, const std::string& data, int64_t length = -1) {
  uint64_t n = length == -1 ? header.size() : static_cast<uint64_t>(length);  // -2: 2^64 - 2
  std::string s(reinterpret_cast<const char*>(&n), 8);
  return s + header + data;
}

// Plain write (no fsync): the corruption tests write hundreds of files.
std::string WriteRaw(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_TRUE(f != nullptr) << path;
  if (f) {
    EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  return path;
}

std::vector<float> Iota(int n, float scale) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = (i - n / 3) * scale + 0.1f * (i % 7);
  return v;
}

TEST(SafetensorsTest, RoundTripF32AndI32) {
  const std::string dir = TmpDir("rt32");
  std::vector<float> a = Iota(6, 0.5f), s = {-7.25f};
  std::vector<int32_t> ids = {INT32_MIN, -1, 0, 7, INT32_MAX};
  SafetensorsWriter w;
  w.Add("layers.0.a", DType::kF32, {2, 3}, a.data(), DType::kF32);
  w.Add("ids", DType::kI32, {5}, ids.data(), DType::kI32);
  w.Add("scalar", DType::kF32, {}, s.data(), DType::kF32);
  w.Add("empty", DType::kF32, {0, 4}, nullptr, DType::kF32);
  w.SetMetadata("format", "pt");
  const std::string path = dir + "/m.safetensors";
  ASSERT_TRUE(w.WriteFile(path).ok());
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"m.safetensors"});  // no temporaries

  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Names(), (std::vector<std::string>{"empty", "ids", "layers.0.a", "scalar"}));
  EXPECT_TRUE((*r)->Has("ids"));
  EXPECT_FALSE((*r)->Has("nope"));
  EXPECT_EQ((*r)->Metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  auto info = (*r)->Info("layers.0.a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->dtype, DType::kF32);
  EXPECT_EQ(info->shape, (Shape{2, 3}));

  std::vector<float> a2(6);
  ASSERT_TRUE((*r)->Read("layers.0.a", {2, 3}, DType::kF32, a2.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), a2.data(), 24), 0);
  std::vector<int32_t> ids2(5);
  ASSERT_TRUE((*r)->Read("ids", {5}, DType::kI32, ids2.data()).ok());
  EXPECT_EQ(ids2, ids);
  float s2 = 0;
  ASSERT_TRUE((*r)->Read("scalar", {}, DType::kF32, &s2).ok());
  EXPECT_EQ(s2, -7.25f);
  ASSERT_TRUE((*r)->Read("empty", {0, 4}, DType::kF32, nullptr).ok());

  // Integers never silently become floats.
  std::vector<float> f(5);
  EXPECT_ERROR((*r)->Read("ids", {5}, DType::kF32, f.data()), absl::StatusCode::kInvalidArgument,
               {"ids", "I32", "f32"});
}

TEST(SafetensorsTest, RoundTripBf16RoundsToNearestEven) {
  const std::string dir = TmpDir("rt16");
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even 1.0;
  // 1 + 3·2^-8 is halfway between 1.0078125 and 1.015625: to the even 1.015625.
  std::vector<float> x = {1.00390625f, 1.01171875f, 1.0f + 1.0f / 128, -2.0f, 0.0f, 3.4e38f};
  const std::vector<uint16_t> want = {0x3f80, 0x3f82, 0x3f81, 0xc000, 0x0000, 0x7f80 /*inf*/};
  std::vector<bf16> direct = {bf16{0x4049}, bf16{0xbf80}};  // 3.140625, -1
  std::vector<float> big = Iota(75000, 1e-3f);              // more than one conversion chunk
  SafetensorsWriter w;
  w.Add("x", DType::kF32, {2, 3}, x.data(), DType::kBF16);
  w.Add("direct", DType::kBF16, {2}, direct.data(), DType::kBF16);
  w.Add("widened", DType::kBF16, {2}, direct.data(), DType::kF32);
  w.Add("big", DType::kF32, {300, 250}, big.data(), DType::kBF16);
  const std::string path = dir + "/m.safetensors";
  ASSERT_TRUE(w.WriteFile(path).ok());

  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Info("x")->dtype, DType::kBF16);
  EXPECT_EQ((*r)->Info("widened")->dtype, DType::kF32);
  std::vector<bf16> xb(6);
  ASSERT_TRUE((*r)->Read("x", {2, 3}, DType::kBF16, xb.data()).ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(xb[i].bits, want[i]) << i;
  std::vector<float> xf(6);
  ASSERT_TRUE((*r)->Read("x", {2, 3}, DType::kF32, xf.data()).ok());
  EXPECT_EQ(xf[0], 1.0f);
  EXPECT_EQ(xf[1], 1.015625f);
  EXPECT_EQ(xf[3], -2.0f);
  EXPECT_TRUE(std::isinf(xf[5]));

  std::vector<float> wf(2);
  ASSERT_TRUE((*r)->Read("widened", {2}, DType::kF32, wf.data()).ok());
  EXPECT_EQ(wf, (std::vector<float>{3.140625f, -1.0f}));
  std::vector<bf16> narrowed(2);  // f32 in the file, read back as bf16: exact here
  ASSERT_TRUE((*r)->Read("widened", {2}, DType::kBF16, narrowed.data()).ok());
  EXPECT_EQ(narrowed[0].bits, 0x4049);
  EXPECT_EQ(narrowed[1].bits, 0xbf80);

  std::vector<float> bigf(big.size());
  ASSERT_TRUE((*r)->Read("big", {300, 250}, DType::kF32, bigf.data()).ok());
  for (size_t i = 0; i < big.size(); ++i) {
    ASSERT_EQ(bigf[i], Bf16ToFloat(FloatToBf16(big[i]))) << i;
    ASSERT_LE(std::fabs(bigf[i] - big[i]), std::fabs(big[i]) / 256) << i;
  }
}

TEST(SafetensorsTest, HeaderLayoutMatchesReferenceWriter) {
  const std::string dir = TmpDir("layout");
  std::vector<float> a = Iota(3, 1), b = Iota(5, 1);
  SafetensorsWriter w;
  w.Add("b16", DType::kF32, {3}, a.data(), DType::kBF16);  // 6 bytes: would misalign what follows
  w.Add("a32", DType::kF32, {5}, b.data(), DType::kF32);
  w.Add("c32", DType::kF32, {3}, a.data(), DType::kF32);
  w.SetMetadata("format", "pt");
  ASSERT_TRUE(w.WriteFile(dir + "/m.safetensors").ok());
  auto raw = ReadFileToString(dir + "/m.safetensors");
  ASSERT_TRUE(raw.ok());
  uint64_t n;
  std::memcpy(&n, raw->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = raw->substr(8, n);
  // Compact JSON, then spaces up to the 8-byte boundary.
  const size_t close = header.rfind('}');
  EXPECT_EQ(header.substr(close + 1), std::string(n - close - 1, ' ')) << header;
  EXPECT_EQ(header.find(' '), n - close - 1 ? close + 1 : std::string::npos) << header;
  Json j = Json::parse(header);
  // Wider elements first, so every tensor is aligned to its element size.
  EXPECT_EQ(j["a32"]["data_offsets"], Json({0, 20}));
  EXPECT_EQ(j["c32"]["data_offsets"], Json({20, 32}));
  EXPECT_EQ(j["b16"]["data_offsets"], Json({32, 38}));
  EXPECT_EQ(j["b16"]["dtype"], "BF16");
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(raw->size(), 8 + n + 38);
  EXPECT_LT(header.find("\"__metadata__\""), header.find("\"a32\""));  // keys sorted
  EXPECT_LT(header.find("\"a32\""), header.find("\"b16\""));
}

class ShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 5; ++i) data_.push_back(Iota(10 * (i + 1), 0.25f * (i + 1)));
    for (int i = 0; i < 5; ++i) {
      // 40, 80, 120, 160 and 200 bytes as f32; the second is stored as bf16 (40 bytes).
      writer_.Add("t" + std::to_string(i), DType::kF32, {i + 1, 10}, data_[i].data(),
                  i == 1 ? DType::kBF16 : DType::kF32);
    }
    writer_.SetMetadata("format", "pt");
  }
  void ExpectLoads(const std::string& path) {
    auto r = SafetensorsReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ((*r)->Names().size(), 5u);
    EXPECT_EQ((*r)->Metadata().at("format"), "pt");
    for (int i = 0; i < 5; ++i) {
      std::vector<float> got(10 * (i + 1));
      ASSERT_TRUE((*r)->Read("t" + std::to_string(i), {i + 1, 10}, DType::kF32, got.data()).ok());
      for (size_t k = 0; k < got.size(); ++k) {
        float want = i == 1 ? Bf16ToFloat(FloatToBf16(data_[i][k])) : data_[i][k];
        ASSERT_EQ(got[k], want) << i << "," << k;
      }
    }
  }
  std::vector<std::vector<float>> data_;
  SafetensorsWriter writer_;
};

TEST_F(ShardedTest, SmallShardsWithIndexLoadBackIdentical) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/sharded/new";  // created
  // Greedy by insertion order with a 130-byte limit: {t0 40, t1 40}, {t2 120}, {t3 160}, {t4 200}.
  ASSERT_TRUE(writer_.WriteSharded(dir, 130).ok());
  EXPECT_EQ(ListDir(dir),
            (std::vector<std::string>{
                "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                "model.safetensors.index.json"}));
  auto text = ReadFileToString(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(text.ok());
  Json index = Json::parse(*text);
  EXPECT_EQ(index["metadata"]["total_size"], 40 + 40 + 120 + 160 + 200);
  EXPECT_EQ(index["weight_map"]["t0"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["t1"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["t4"], "model-00004-of-00004.safetensors");
  ExpectLoads(dir);
  ExpectLoads(dir + "/model.safetensors.index.json");
  // Each shard is a valid file on its own.
  auto shard = SafetensorsReader::Open(dir + "/model-00003-of-00004.safetensors");
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ((*shard)->Names(), std::vector<std::string>{"t3"});
}

// A rank loading its FSDP slice reads part of a tensor: the elements asked for, converted.
TEST_F(ShardedTest, ReadRangeReadsPartOfATensor) {
  const std::string dir = TmpDir("range");
  ASSERT_TRUE(writer_.WriteSharded(dir, 130).ok());
  auto r = SafetensorsReader::Open(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<float> got(20);
  ASSERT_TRUE((*r)->ReadRange("t3", {4, 10}, 13, 20, DType::kF32, got.data()).ok());
  EXPECT_EQ(got, std::vector<float>(data_[3].begin() + 13, data_[3].begin() + 33));
  std::vector<float> b16(5);  // stored as bf16
  ASSERT_TRUE((*r)->ReadRange("t1", {2, 10}, 15, 5, DType::kF32, b16.data()).ok());
  for (int k = 0; k < 5; ++k) EXPECT_EQ(b16[k], Bf16ToFloat(FloatToBf16(data_[1][15 + k])));
  ASSERT_TRUE((*r)->ReadRange("t3", {4, 10}, 40, 0, DType::kF32, got.data()).ok());
  EXPECT_ERROR((*r)->ReadRange("t3", {4, 10}, 30, 11, DType::kF32, got.data()),
               absl::StatusCode::kOutOfRange, {"t3", "40 elements", "[30, 41)"});
  EXPECT_ERROR((*r)->ReadRange("t3", {40}, 0, 1, DType::kF32, got.data()),
               absl::StatusCode::kInvalidArgument, {"t3", "expected"});
}

// Writers of a split need only the data of their own part; the others' tensors are names.
TEST_F(ShardedTest, AWriterNeedsOnlyTheDataOfItsOwnPart) {
  const std::string dir = TmpDir("parts");
  const std::vector<int> part = writer_.PartOfEachTensor(3);
  ASSERT_EQ(part.size(), 5u);
  for (int p = 0; p < 3; ++p) {
    SafetensorsWriter mine;
    mine.SetMetadata("format", "pt");
    for (int i = 0; i < 5; ++i) {
      mine.Add("t" + std::to_string(i), DType::kF32, {i + 1, 10},
               part[i] == p ? data_[i].data() : nullptr, i == 1 ? DType::kBF16 : DType::kF32);
    }
    ASSERT_TRUE(mine.WriteShard(dir, p, 3).ok()) << "part " << p;
    if (p == 0) {
      // Without a tensor of its own part, a writer fails naming it.
      SafetensorsWriter none;
      for (int i = 0; i < 5; ++i) {
        none.Add("t" + std::to_string(i), DType::kF32, {i + 1, 10}, nullptr, DType::kF32);
      }
      int first = 0;
      while (part[first] != 0) ++first;
      EXPECT_ERROR(none.WriteShard(TmpDir("parts_none"), 0, 3).status(),
                   absl::StatusCode::kInvalidArgument, {"t" + std::to_string(first), "no data"});
    }
  }
  SafetensorsWriter names;
  for (int i = 0; i < 5; ++i) {
    names.Add("t" + std::to_string(i), DType::kF32, {i + 1, 10}, nullptr,
              i == 1 ? DType::kBF16 : DType::kF32);
  }
  ASSERT_TRUE(names.WriteShardIndex(dir, 3).ok());
  ExpectLoads(dir);
}

// Tensors put one at a time, in any order, give the bytes WriteShard and WriteFile write.
TEST_F(ShardedTest, PiecewiseWritesGiveTheSameBytes) {
  const std::string whole = TmpDir("pieces_whole"), pieced = TmpDir("pieces_pieced");
  SafetensorsWriter names;  // no data: the pieces bring it
  names.SetMetadata("format", "pt");
  for (int i = 0; i < 5; ++i) {
    names.Add("t" + std::to_string(i), DType::kF32, {i + 1, 10}, nullptr,
              i == 1 ? DType::kBF16 : DType::kF32);
  }
  const std::vector<int> part = writer_.PartOfEachTensor(3);
  for (int p = 0; p < 3; ++p) {
    auto wrote = writer_.WriteShard(whole, p, 3);
    ASSERT_TRUE(wrote.ok()) << wrote.status();
    auto file = names.OpenShard(pieced, p, 3);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->name(), *wrote);
    for (int i = 4; i >= 0; --i) {  // the reverse of the file's order
      const std::string t = "t" + std::to_string(i);
      EXPECT_EQ((*file)->Holds(t), part[i] == p) << t;
      if (part[i] == p) {
        ASSERT_TRUE((*file)->Put(t, DType::kF32, data_[i].data()).ok()) << t;
      }
    }
    ASSERT_TRUE((*file)->Commit().ok());
    auto a = ReadFileToString(whole + "/" + *wrote);
    auto b = ReadFileToString(pieced + "/" + *wrote);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << *wrote;
  }
  ASSERT_TRUE(names.WriteShardIndex(pieced, 3).ok());
  ExpectLoads(pieced);

  // WriteSharded's greedy layout (130 bytes: four files and an index), the same way.
  const std::string greedy_whole = TmpDir("pieces_greedy_whole");
  const std::string greedy_pieced = TmpDir("pieces_greedy_pieced");
  ASSERT_TRUE(writer_.WriteSharded(greedy_whole, 130).ok());
  auto files = names.OpenSharded(greedy_pieced, 130);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 4u);
  for (int i = 0; i < 5; ++i) {
    const std::string t = "t" + std::to_string(i);
    for (auto& f : *files) {
      if (f->Holds(t)) {
        ASSERT_TRUE(f->Put(t, DType::kF32, data_[i].data()).ok()) << t;
      }
    }
  }
  for (auto& f : *files) ASSERT_TRUE(f->Commit().ok()) << f->name();
  ASSERT_TRUE(names.WriteShardedIndex(greedy_pieced, 130).ok());
  EXPECT_EQ(ListDir(greedy_pieced), ListDir(greedy_whole));
  for (const std::string& name : ListDir(greedy_whole)) {
    EXPECT_EQ(*ReadFileToString(greedy_whole + "/" + name),
              *ReadFileToString(greedy_pieced + "/" + name))
        << name;
  }

  // One file; a tensor it lacks, one put twice, one never put (the file then never appears).
  auto file = names.OpenFile(pieced + "/one.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_ERROR((*file)->Put("t9", DType::kF32, data_[0].data()), absl::StatusCode::kInvalidArgument,
               {"t9", "not one of this file's"});
  ASSERT_TRUE((*file)->Put("t0", DType::kF32, data_[0].data()).ok());
  EXPECT_ERROR((*file)->Put("t0", DType::kF32, data_[0].data()), absl::StatusCode::kInvalidArgument,
               {"t0", "twice"});
  EXPECT_ERROR((*file)->Commit(), absl::StatusCode::kFailedPrecondition, {"never written"});
  file->reset();
  EXPECT_FALSE(PathExists(pieced + "/one.safetensors"));
  EXPECT_EQ(ListDir(pieced).size(), 4u) << "no temporary file is left";
}

TEST_F(ShardedTest, EverythingInOneShardWritesModelSafetensors) {
  const std::string dir = TmpDir("one");
  ASSERT_TRUE(WriteFileAtomic(dir + "/notes.txt", "keep me").ok());
  ASSERT_TRUE(writer_.WriteSharded(dir, 1 << 20).ok());
  EXPECT_EQ(ListDir(dir), (std::vector<std::string>{"model.safetensors", "notes.txt"}));
  ExpectLoads(dir);
  ExpectLoads(dir + "/model.safetensors");
  EXPECT_ERROR(writer_.WriteSharded(dir, 0), absl::StatusCode::kInvalidArgument,
               {"max_shard_bytes"});
}

TEST_F(ShardedTest, DirectoryWithBothLayoutsIsAmbiguous) {
  const std::string dir = TmpDir("both");
  ASSERT_TRUE(writer_.WriteSharded(dir, 1 << 20).ok());
  ASSERT_TRUE(writer_.WriteSharded(dir, 100).ok());
  EXPECT_ERROR(OpenStatus(dir), absl::StatusCode::kFailedPrecondition,
               {"model.safetensors", "model.safetensors.index.json"});
  ExpectLoads(dir + "/model.safetensors");  // each still opens by name
  ExpectLoads(dir + "/model.safetensors.index.json");
}

TEST(SafetensorsTest, MissingTensorAndWrongShape) {
  const std::string dir = TmpDir("lookup");
  std::vector<float> a = Iota(6, 1);
  SafetensorsWriter w;
  w.Add("w", DType::kF32, {2, 3}, a.data(), DType::kF32);
  ASSERT_TRUE(w.WriteFile(dir + "/m.safetensors").ok());
  auto r = SafetensorsReader::Open(dir + "/m.safetensors");
  ASSERT_TRUE(r.ok());
  std::vector<float> out(6);
  EXPECT_ERROR((*r)->Read("lm_head.weight", {2, 3}, DType::kF32, out.data()),
               absl::StatusCode::kNotFound, {"lm_head.weight", "m.safetensors"});
  EXPECT_ERROR((*r)->Info("lm_head.weight").status(), absl::StatusCode::kNotFound,
               {"lm_head.weight"});
  EXPECT_ERROR((*r)->Read("w", {3, 2}, DType::kF32, out.data()), absl::StatusCode::kInvalidArgument,
               {"'w'", "[2, 3]", "[3, 2]"});
}

TEST(SafetensorsTest, CorruptFilesAreErrorsNamingFileAndTensor) {
  const std::string dir = TmpDir("corrupt");
  const std::string data(16, '\x01');  // room for 4 f32
  auto entry = [](const char* dtype, const char* shape, const char* offsets) {
    return absl::StrCat("\"", dtype, "\", \"shape\": ", shape, ", \"data_offsets\": ", offsets);
  };
  auto file = [&](const std::string& name, const std::string& body, const std::string& d) {
    return WriteRaw(dir, name, RawFile("{\"w\": {\"dtype\": " + body + "}}", d));
  };
  const auto kLoss = absl::StatusCode::kDataLoss;

  std::string p = file("ok.safetensors", entry("F32", "[4]", "[0, 16]"), data);
  ASSERT_TRUE(OpenStatus(p).ok()) << OpenStatus(p);

  EXPECT_ERROR(OpenStatus(WriteRaw(dir, "short", "abc")), kLoss, {"short", "too short"});
  EXPECT_ERROR(OpenStatus(WriteRaw(dir, "empty", "")), kLoss, {"too short"});
  // The reason never quotes the file's bytes: its first 8 are the header length (issue 53 R1).
  const absl::Status len = OpenStatus(WriteRaw(dir, "len", RawFile("{}", "", 1000)));
  EXPECT_ERROR(len, kLoss, {"len", "the header length exceeds the file"});
  EXPECT_EQ(std::string(len.message()).find("1000"), std::string::npos) << len;
  EXPECT_ERROR(OpenStatus(WriteRaw(dir, "huge", RawFile("{}", "", -2))), kLoss, {"exceeds"});
  EXPECT_ERROR(OpenStatus(WriteRaw(dir, "json", RawFile("{\"w\": {\"dtype\"", ""))), kLoss,
               {"json", "not valid JSON"});
  EXPECT_ERROR(OpenStatus(WriteRaw(dir, "array", RawFile("[1]", ""))), kLoss,
               {"not a JSON object"});
  EXPECT_ERROR(OpenStatus(file("range", entry("F32", "[4]", "[4, 20]"), data)), kLoss,
               {"range", "'w'", "[4, 20]", "past the data"});
  EXPECT_ERROR(OpenStatus(file("size", entry("F32", "[3]", "[0, 16]"), data)), kLoss,
               {"size", "'w'", "16 bytes", "needs 12"});
  EXPECT_ERROR(OpenStatus(file("rev", entry("F32", "[0]", "[8, 4]"), data)), kLoss, {"reversed"});
  EXPECT_ERROR(OpenStatus(file("neg", entry("F32", "[-4]", "[0, 16]"), data)), kLoss, {"shape"});
  EXPECT_ERROR(
      OpenStatus(file(
          "big", entry("F32", "[4611686018427387904, 4611686018427387904, 0]", "[0, 0]"), data)),
      kLoss, {"too large"});
  EXPECT_ERROR(OpenStatus(file("offs", entry("F32", "[4]", "[0]"), data)), kLoss, {"data_offsets"});
  EXPECT_ERROR(OpenStatus(file("f16", entry("F16", "[8]", "[0, 16]"), data)),
               absl::StatusCode::kInvalidArgument, {"f16", "'w'", "F16"});
  EXPECT_ERROR(
      OpenStatus(WriteRaw(
          dir, "overlap",
          RawFile("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                  " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                  data))),
      kLoss, {"overlap", "'a'", "'b'"});
  EXPECT_ERROR(OpenStatus(WriteRaw(dir, "meta", RawFile("{\"__metadata__\": {\"k\": 1}}", ""))),
               kLoss, {"__metadata__"});
  // Deep nesting must not overflow the stack while parsing or freeing the header.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_ERROR(OpenStatus(WriteRaw(dir, "deep", RawFile(deep, ""))), kLoss, {"not a JSON object"});
  EXPECT_ERROR(OpenStatus(dir + "/absent.safetensors"), absl::StatusCode::kNotFound, {"absent"});
  EXPECT_ERROR(OpenStatus(TmpDir("nothing")), absl::StatusCode::kNotFound, {"neither"});
}

// Every truncation of a valid file, cut in the header or in the data, is an error at Open.
TEST(SafetensorsTest, EveryTruncationFailsCleanly) {
  const std::string dir = TmpDir("trunc");
  std::vector<float> a = Iota(6, 1);
  std::vector<int32_t> ids = {1, 2, 3};
  SafetensorsWriter w;
  w.Add("a", DType::kF32, {2, 3}, a.data(), DType::kBF16);
  w.Add("ids", DType::kI32, {3}, ids.data(), DType::kI32);
  ASSERT_TRUE(w.WriteFile(dir + "/full").ok());
  auto full = ReadFileToString(dir + "/full");
  ASSERT_TRUE(full.ok());
  for (size_t len = 0; len < full->size(); ++len) {
    absl::Status st = OpenStatus(WriteRaw(dir, "cut", full->substr(0, len)));
    ASSERT_FALSE(st.ok()) << "opened a file cut at " << len << " of " << full->size();
    ASSERT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  }
}

// Flipped bytes anywhere in the header: an error or a file whose tensors all read; never a crash.
TEST(SafetensorsTest, CorruptedHeaderBytesNeverCrash) {
  const std::string dir = TmpDir("flip");
  std::vector<float> a = Iota(12, 1);
  SafetensorsWriter w;
  w.Add("a", DType::kF32, {3, 4}, a.data(), DType::kF32);
  w.Add("b", DType::kF32, {12}, a.data(), DType::kBF16);
  ASSERT_TRUE(w.WriteFile(dir + "/full").ok());
  const std::string full = *ReadFileToString(dir + "/full");
  int opened = 0;
  for (size_t i = 0; i < full.size() - 72; ++i) {  // the header and its length prefix
    for (char c : {'0', '9', '"', '}', '\xff', '-'}) {
      std::string bad = full;
      bad[i] = c;
      auto r = SafetensorsReader::Open(WriteRaw(dir, "bad", bad));
      if (!r.ok()) continue;
      ++opened;
      for (const std::string& name : (*r)->Names()) {
        auto info = (*r)->Info(name);
        ASSERT_TRUE(info.ok());
        std::vector<float> out(NumElements(info->shape));
        EXPECT_TRUE((*r)->Read(name, info->shape, DType::kF32, out.data()).ok());
      }
    }
  }
  EXPECT_GT(opened, 0);  // some flips are harmless (inside a name), and those must still work
}

TEST(SafetensorsTest, BadIndexes) {
  const std::string dir = TmpDir("index");
  std::vector<float> a = Iota(4, 1);
  SafetensorsWriter w;
  w.Add("a", DType::kF32, {4}, a.data(), DType::kF32);
  ASSERT_TRUE(w.WriteFile(dir + "/shard-a.safetensors").ok());
  auto index = [&](const std::string& name, const std::string& body) {
    return WriteRaw(dir, name + ".index.json", body);
  };
  ASSERT_TRUE(OpenStatus(index("good", R"({"weight_map": {"a": "shard-a.safetensors"}})")).ok());
  EXPECT_ERROR(
      OpenStatus(index("missing_shard", R"({"weight_map": {"a": "shard-b.safetensors"}})")),
      absl::StatusCode::kNotFound, {"missing_shard.index.json", "shard-b.safetensors", "'a'"});
  EXPECT_ERROR(OpenStatus(index("absent", R"({"weight_map": {"a": "shard-a.safetensors",
                                                            "z": "shard-a.safetensors"}})")),
               absl::StatusCode::kDataLoss, {"absent.index.json", "'z'", "shard-a.safetensors"});
  EXPECT_ERROR(OpenStatus(index("notjson", "{\"weight_map\": ")), absl::StatusCode::kDataLoss,
               {"notjson.index.json", "not valid JSON"});
  EXPECT_ERROR(OpenStatus(index("nomap", R"({"metadata": {}})")), absl::StatusCode::kDataLoss,
               {"weight_map"});
  EXPECT_ERROR(OpenStatus(index("nonstring", R"({"weight_map": {"a": 3}})")),
               absl::StatusCode::kDataLoss, {"'a'"});
  // A corrupt shard is reported through the index, naming the shard file.
  WriteRaw(dir, "shard-c.safetensors", "garbage!garbage!");
  EXPECT_ERROR(OpenStatus(index("corrupt", R"({"weight_map": {"c": "shard-c.safetensors"}})")),
               absl::StatusCode::kDataLoss, {"shard-c.safetensors"});
}

// An index's weight_map is data from whoever wrote the model directory: its shards stay beside
// the index and, under ithacad, inside the allowed roots, decided before anything is opened.
// A file outside (a real safetensors, /etc/shadow, one that does not exist) gets one answer,
// which quotes none of its bytes (issue 53 R1).
TEST(SafetensorsTest, IndexShardsStayBesideTheIndexAndInsideTheRoots) {
  const std::string root = TmpDir("roots/allowed");
  const std::string outside = TmpDir("roots/outside");
  std::vector<float> a = Iota(4, 1);
  SafetensorsWriter w;
  w.Add("a", DType::kF32, {4}, a.data(), DType::kF32);
  ASSERT_TRUE(w.WriteFile(root + "/shard-a.safetensors").ok());
  ASSERT_TRUE(w.WriteFile(outside + "/real.safetensors").ok());
  WriteRaw(outside, "shadow", "root:*:20000:0:99999:7:::\n");
  unlink((root + "/link.safetensors").c_str());
  ASSERT_EQ(symlink((outside + "/real.safetensors").c_str(), (root + "/link.safetensors").c_str()),
            0);
  auto index = [&](const std::string& name, const std::string& shard) {
    return WriteRaw(root, name + ".index.json", R"({"weight_map": {"a": ")" + shard + R"("}})");
  };
  // Names that leave the index's directory are refused whatever the roots, before any open.
  for (const std::string& shard :
       {std::string("../outside/real.safetensors"), std::string("../outside/shadow"),
        std::string("../outside/no-such-file"), outside + "/real.safetensors",
        std::string("/etc/shadow"), std::string(".."), std::string("")}) {
    absl::Status st = OpenStatus(index("escape", shard));
    EXPECT_ERROR(st, absl::StatusCode::kDataLoss,
                 {"escape.index.json: weight_map['a'] names", "not a file name beside the index"});
    EXPECT_EQ(std::string(st.message()).find("root:"), std::string::npos) << st;
  }
  ASSERT_TRUE(setenv("ITHACA_ALLOWED_ROOTS", root.c_str(), 1) == 0);
  // A shard beside the index inside the roots opens; a link beside it that leads out of the roots,
  // and a missing sibling outside through that link, are refused alike.
  EXPECT_TRUE(OpenStatus(index("good", "shard-a.safetensors")).ok());
  absl::Status link = OpenStatus(index("link", "link.safetensors"));
  EXPECT_ERROR(
      link, absl::StatusCode::kPermissionDenied,
      {"link.index.json: shard link.safetensors (holding 'a'): ", "outside the allowed roots"});
  unlink((root + "/shadow-link").c_str());
  ASSERT_EQ(symlink((outside + "/shadow").c_str(), (root + "/shadow-link").c_str()), 0);
  unlink((root + "/missing-link").c_str());
  ASSERT_EQ(symlink((outside + "/no-such-file").c_str(), (root + "/missing-link").c_str()), 0);
  absl::Status shadow = OpenStatus(index("same", "shadow-link"));
  absl::Status missing = OpenStatus(index("same", "missing-link"));
  for (const absl::Status& st : {shadow, missing}) {
    EXPECT_ERROR(st, absl::StatusCode::kPermissionDenied, {"outside the allowed roots"});
    EXPECT_EQ(std::string(st.message()).find("root:"), std::string::npos) << st;
    EXPECT_EQ(std::string(st.message()).find("such file"), std::string::npos) << st;
  }
  unsetenv("ITHACA_ALLOWED_ROOTS");
  // Without roots (no ithacad), the link is the caller's to follow; a file that is not
  // safetensors is refused without its size or its first 8 bytes (the header length).
  EXPECT_TRUE(OpenStatus(index("link", "link.safetensors")).ok());
  absl::Status not_safetensors = OpenStatus(index("same", "shadow-link"));
  EXPECT_ERROR(not_safetensors, absl::StatusCode::kDataLoss, {"not a safetensors file"});
  const std::string msg(not_safetensors.message());
  uint64_t first8 = 0;
  std::memcpy(&first8, "root:*:2", 8);
  EXPECT_EQ(msg.find(std::to_string(first8)), std::string::npos) << msg;
  EXPECT_EQ(msg.find(" bytes"), std::string::npos) << msg;
}

TEST(SafetensorsTest, FailedWritesLeaveNoFile) {
  const std::string dir = TmpDir("fail");
  std::vector<float> a = Iota(4, 1);
  std::vector<int32_t> ids = {1, 2, 3, 4};
  SafetensorsWriter w;
  w.Add("a", DType::kF32, {4}, a.data(), DType::kF32);
  EXPECT_FALSE(w.WriteFile(dir + "/no/such/dir/m.safetensors").ok());
  EXPECT_FALSE(PathExists(dir + "/no"));

  SafetensorsWriter dup = w;
  dup.Add("a", DType::kF32, {4}, a.data(), DType::kF32);
  EXPECT_ERROR(dup.WriteFile(dir + "/dup.safetensors"), absl::StatusCode::kInvalidArgument,
               {"'a'", "twice"});
  SafetensorsWriter conv;
  conv.Add("ids", DType::kI32, {4}, ids.data(), DType::kBF16);
  EXPECT_ERROR(conv.WriteFile(dir + "/conv.safetensors"), absl::StatusCode::kInvalidArgument,
               {"'ids'", "i32", "bf16"});
  SafetensorsWriter utf;
  utf.Add("bad\xff", DType::kF32, {4}, a.data(), DType::kF32);
  EXPECT_EQ(utf.WriteFile(dir + "/utf.safetensors").code(), absl::StatusCode::kInvalidArgument);
  SafetensorsWriter reserved;
  reserved.Add("__metadata__", DType::kF32, {4}, a.data(), DType::kF32);
  EXPECT_FALSE(reserved.WriteFile(dir + "/reserved.safetensors").ok());
  EXPECT_TRUE(ListDir(dir).empty()) << ListDir(dir)[0];

  // Sharded export under a regular file: MakeDirs fails, nothing written.
  ASSERT_TRUE(WriteFileAtomic(dir + "/plain", "x").ok());
  EXPECT_FALSE(w.WriteSharded(dir + "/plain/out", 1).ok());
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"plain"});

  // Overwriting replaces the file whole and leaves no temporary behind.
  ASSERT_TRUE(w.WriteFile(dir + "/m.safetensors").ok());
  ASSERT_TRUE(w.WriteFile(dir + "/m.safetensors").ok());
  EXPECT_TRUE(NoTempFiles(dir));
  EXPECT_TRUE(OpenStatus(dir + "/m.safetensors").ok());
}

}  // namespace
}  // namespace ithaca
