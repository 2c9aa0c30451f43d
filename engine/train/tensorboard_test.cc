// The TFRecord framing and the Event encoding of engine/train/tensorboard.h, byte for byte
// (the tensorboard package reading them back is tensorboard_read_test).
#include "engine/train/tensorboard.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"

namespace ithaca {
namespace {

std::string Tmp() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

TEST(TensorBoardTest, Crc32cIsCastagnolis) {
  // The check value of CRC-32C (RFC 3720 B.4) and a masked one TFRecord readers recompute.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  const uint32_t c = Crc32c("abc", 3);
  EXPECT_EQ(MaskedCrc32c("abc", 3), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoardTest, AScalarEventIsTheProtobufTensorFlowWrites) {
  // Event{wall_time: 1.5, step: 3, summary{value{tag: "a", simple_value: 2.0}}}, encoded by hand
  // from the wire format: 09 <double> 10 03 2a 0a (Summary, 10 bytes) 0a 08 (Value, 8 bytes)
  // 0a 01 'a' 15 <float 2.0>.
  const std::string e = TensorBoardScalarEvent(1.5, 3, {{"a", 2.0}});
  std::string want = "\x09";
  const double w = 1.5;
  want.append(reinterpret_cast<const char*>(&w), 8);
  want += std::string(
      "\x10\x03\x2a\x0a\x0a\x08\x0a\x01"
      "a"
      "\x15",
      10);
  const float f = 2.0f;
  want.append(reinterpret_cast<const char*>(&f), 4);
  EXPECT_EQ(e, want);
}

TEST(TensorBoardTest, RecordsAreFramedAndChecksummed) {
  const std::string dir = Tmp() + "/tb";
  auto w = TensorBoardWriter::Open(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Write(1, {{"train/loss", 5.5}, {"train/lr", 1e-3}}).ok());
  ASSERT_TRUE((*w)->Write(2, {{"train/loss", 5.25}}).ok());
  EXPECT_NE((*w)->path().find(dir + "/events.out.tfevents."), std::string::npos);
  auto text = ReadFileToString((*w)->path());
  ASSERT_TRUE(text.ok()) << text.status();
  std::vector<std::string> records;
  size_t at = 0;
  while (at < text->size()) {
    ASSERT_GE(text->size() - at, 12u);
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, text->data() + at, 8);
    std::memcpy(&len_crc, text->data() + at + 8, 4);
    EXPECT_EQ(len_crc, MaskedCrc32c(text->data() + at, 8));
    ASSERT_LE(at + 12 + len + 4, text->size());
    const std::string data = text->substr(at + 12, len);
    std::memcpy(&data_crc, text->data() + at + 12 + len, 4);
    EXPECT_EQ(data_crc, MaskedCrc32c(data.data(), data.size()));
    records.push_back(data);
    at += 12 + len + 4;
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("\x1a\x0d"
                            "brain.Event:2"),
            std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  EXPECT_NE(records[1].find("train/lr"), std::string::npos);
  // A second writer in the same directory makes a file of its own.
  auto again = TensorBoardWriter::Open(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE((*again)->path(), (*w)->path());
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Issue 43 N2: a link at checkpoint.dir/tensorboard must not make the worker write its event
// file outside the allowed roots; inside them the file is made as before.
TEST(TensorBoardTest, TheEventFileStaysInsideTheAllowedRoots) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp ? tmp : "/tmp") + "/tb_roots";
  const std::string root = base + "/root", outside = base + "/outside";
  ASSERT_TRUE(MakeDirs(root + "/ckpt").ok());
  ASSERT_TRUE(MakeDirs(outside).ok());
  const std::string link = root + "/ckpt/tensorboard";
  unlink(link.c_str());
  ASSERT_EQ(symlink(outside.c_str(), link.c_str()), 0);
  setenv(kAllowedRootsEnv, root.c_str(), 1);
  auto w = TensorBoardWriter::Open(link);
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kPermissionDenied) << w.status();
  DIR* d = opendir(outside.c_str());
  ASSERT_NE(d, nullptr);
  int entries = 0;
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 0) << "an event file was made outside the roots";
  auto inside = TensorBoardWriter::Open(root + "/ckpt/tb");
  EXPECT_TRUE(inside.ok()) << inside.status();
  unsetenv(kAllowedRootsEnv);
}

}  // namespace
}  // namespace ithaca
