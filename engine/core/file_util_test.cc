// Inputs must be regular files: a FIFO or a device given as a spec, config, weights or data path
// is an error naming it, returned at once (never a reader blocked forever).
#include "engine/core/file_util.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string TestDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d ? d : "/tmp";
}

TEST(FileUtilTest, ReadsARegularFile) {
  const std::string path = TestDir() + "/regular.txt";
  ASSERT_TRUE(WriteFileAtomic(path, "hello\n").ok());
  absl::StatusOr<std::string> text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "hello\n");
}

// A file past the reader's bound is refused before it is read (issue 43 N4: a 2 GiB
// "config.json" took the daemon's memory).
TEST(FileUtilTest, AFilePastItsBoundIsRefusedUnread) {
  const std::string path = ::testing::TempDir() + "/bounded.txt";
  ASSERT_TRUE(WriteFileAtomic(path, std::string(100, 'x')).ok());
  EXPECT_TRUE(ReadFileToString(path, 100).ok());
  absl::StatusOr<std::string> over = ReadFileToString(path, 99);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("100 bytes, more than the 99"), std::string::npos)
      << over.status();
  // The default bound holds too: a sparse file of 1 GiB costs nothing to make.
  ASSERT_EQ(truncate(path.c_str(), int64_t{1} << 30), 0);
  EXPECT_FALSE(ReadFileToString(path).ok());
}

TEST(FileUtilTest, AFifoIsRefusedWithoutBlocking) {
  const std::string path = TestDir() + "/fifo";
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<std::string> text = ReadFileToString(path);  // would hang before
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), path + ": is a FIFO, expected a regular file");
}

TEST(FileUtilTest, DevicesDirectoriesAndMissingFilesAreNamed) {
  absl::StatusOr<std::string> dev = ReadFileToString("/dev/zero");  // would never end
  EXPECT_EQ(dev.status().message(), "/dev/zero: is a character device, expected a regular file");
  absl::StatusOr<std::string> dir = ReadFileToString(TestDir());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos);
  absl::StatusOr<std::string> missing = ReadFileToString(TestDir() + "/no-such-file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no-such-file: cannot open"), std::string::npos);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// A write the file system refuses (here: past RLIMIT_FSIZE, as a full disk would) is an I/O
// error naming the cause, not RESOURCE_EXHAUSTED, which the worker reports as "out of memory".
TEST(FileUtilTest, AFailedWriteIsAnIoErrorNotOutOfMemory) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(t ? t : "/tmp") + "/too_large.bin";
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status st = WriteFileAtomic(path, std::string(1 << 20, 'x'));
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find(strerror(EFBIG)), std::string::npos) << st;
  EXPECT_FALSE(PathExists(path));
}

}  // namespace
}  // namespace ithaca
