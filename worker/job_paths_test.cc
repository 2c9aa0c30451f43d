#include "worker/job_paths.h"

#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace ithaca {
namespace {

std::string Real(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? buf : "";
}

// A queued job's checkpoint.dir, not yet made when admission checked it, replaced by a link out
// of the roots before the job starts: the worker refuses it and writes nothing outside.
TEST(JobPathsTest, ACheckpointDirSwappedForALinkIsRefused) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(t ? t : "/tmp") + "/job_paths";
  ASSERT_EQ(
      system(("rm -rf " + base + " && mkdir -p " + base + "/root " + base + "/outside").c_str()),
      0);
  const std::string root = Real(base + "/root"), outside = Real(base + "/outside");
  std::ofstream(root + "/corpus.tok") << "x";
  JobSpec spec;
  spec.data.path = root + "/corpus.tok";
  spec.checkpoint.dir = root + "/ckpt/run1";
  ASSERT_TRUE(CheckJobPaths(spec, {root}).ok());
  struct stat st;
  EXPECT_EQ(stat(spec.checkpoint.dir.c_str(), &st), 0) << "made by the check";

  spec.checkpoint.dir = root + "/later/run";
  ASSERT_EQ(symlink(outside.c_str(), (root + "/later").c_str()), 0);
  absl::Status refused = CheckJobPaths(spec, {root});
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  EXPECT_NE(refused.message().find("checkpoint.dir"), std::string::npos) << refused;
  EXPECT_EQ(refused.message().find(outside), std::string::npos) << refused;
  EXPECT_NE(stat((outside + "/run").c_str(), &st), 0) << "nothing made outside";

  // A data file replaced by a link out of the roots.
  spec.checkpoint.dir.clear();
  unlink((root + "/corpus.tok").c_str());
  std::ofstream(outside + "/secret.tok") << "x";
  ASSERT_EQ(symlink((outside + "/secret.tok").c_str(), (root + "/corpus.tok").c_str()), 0);
  EXPECT_TRUE(absl::IsPermissionDenied(CheckJobPaths(spec, {root})));
  EXPECT_TRUE(CheckJobPaths(spec, {}).ok()) << "no roots: no restriction";
}

// init.from: the weights of a phase before, written after admission; a model file among them
// that links out of the roots is refused before anything is read.
TEST(JobPathsTest, InitFromIsCheckedAgainstTheRoots) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(t ? t : "/tmp") + "/job_paths_init";
  ASSERT_EQ(
      system(
          ("rm -rf " + base + " && mkdir -p " + base + "/root/model " + base + "/outside").c_str()),
      0);
  const std::string root = Real(base + "/root"), outside = Real(base + "/outside");
  std::ofstream(root + "/model/config.json") << "{}";
  JobSpec spec;
  spec.init.from = root + "/model";
  ASSERT_TRUE(CheckJobPaths(spec, {root}).ok());
  std::ofstream(outside + "/secret.safetensors") << "x";
  ASSERT_EQ(symlink((outside + "/secret.safetensors").c_str(),
                    (root + "/model/model.safetensors").c_str()),
            0);
  absl::Status refused = CheckJobPaths(spec, {root});
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  EXPECT_NE(refused.message().find("init.from"), std::string::npos) << refused;
  spec.init.from = outside;
  EXPECT_TRUE(absl::IsPermissionDenied(CheckJobPaths(spec, {root})));
}

}  // namespace
}  // namespace ithaca
