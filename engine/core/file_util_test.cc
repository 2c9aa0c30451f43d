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
