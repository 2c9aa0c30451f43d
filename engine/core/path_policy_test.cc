// The path policy admission and the workers share: bounded pattern expansion, every brace
// alternative checked against the roots before it is looked at, opens that refuse links.
#include "engine/core/path_policy.h"

#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ithaca {
namespace {

std::string Real(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? buf : "";
}

// <tmp>/<name>/{root,outside}: root holds a.tok, b.tok and shards/s{1,2}.tok; outside holds
// secret.tok and dir/{alpha,beta}.
struct Tree {
  std::string root, outside;
  std::vector<std::string> roots;
  explicit Tree(const std::string& name) {
    const char* t = std::getenv("TEST_TMPDIR");
    const std::string base = std::string(t ? t : "/tmp") + "/" + name;
    EXPECT_EQ(
        system(("rm -rf " + base + " && mkdir -p " + base + "/root/shards " + base + "/outside/dir")
                   .c_str()),
        0);
    root = Real(base + "/root");
    outside = Real(base + "/outside");
    for (const std::string& f :
         {root + "/a.tok", root + "/b.tok", root + "/shards/s1.tok", root + "/shards/s2.tok",
          outside + "/secret.tok", outside + "/dir/alpha", outside + "/dir/beta"}) {
      std::ofstream(f) << "x";
    }
    roots = {root};
  }
};

TEST(ExpandPatternTest, BracesAndGlobs) {
  Tree t("expand");
  auto files = ExpandPattern(t.root + "/{a,b}.tok", t.roots);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{t.root + "/a.tok", t.root + "/b.tok"}));
  files = ExpandPattern(t.root + "/{*.tok,shards/s?.tok,a.tok}", t.roots);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 4u) << "sorted, without repeats";
  files = ExpandPattern(t.root + "/s*/s[12].tok");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 2u);
  // Not a pattern: returned as it is (the reader reports a missing file).
  files = ExpandPattern(t.root + "/missing.tok", t.roots);
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(files->size(), 1u);
  EXPECT_TRUE(absl::IsNotFound(ExpandPattern(t.root + "/*.bin").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ExpandPattern(t.root + "/{a,b.tok").status()));
}

// A typo in one alternative is an error naming it, not a silently smaller data set.
TEST(ExpandPatternTest, AMissingAlternativeIsAnError) {
  Tree t("missing_alternative");
  auto files = ExpandPattern(t.root + "/{a.tok,typo.tok}", t.roots);
  EXPECT_TRUE(absl::IsNotFound(files.status())) << files.status();
  EXPECT_NE(files.status().message().find(t.root + "/typo.tok: no such file"), std::string::npos)
      << files.status();
  EXPECT_TRUE(absl::IsNotFound(ExpandPattern(t.root + "/{a.tok,nothing*.tok}").status()));
}

// Every alternative is checked against the roots before it is looked at: the answer for a path
// outside is the same whether it exists or not, and a listing outside is never read.
TEST(ExpandPatternTest, AlternativesOutsideTheRootsAreRefusedUnseen) {
  Tree t("outside_alternative");
  auto exists = ExpandPattern(t.root + "/{a.tok,../outside/secret.tok}", t.roots);
  auto missing = ExpandPattern(t.root + "/{a.tok,../outside/no-such-file}", t.roots);
  EXPECT_TRUE(absl::IsPermissionDenied(exists.status())) << exists.status();
  EXPECT_TRUE(absl::IsPermissionDenied(missing.status())) << missing.status();
  auto listing = ExpandPattern(t.root + "/{a.tok,../outside/dir/*}", t.roots);
  EXPECT_TRUE(absl::IsPermissionDenied(listing.status())) << listing.status();
  for (const auto& st : {exists.status(), missing.status(), listing.status()}) {
    const std::string msg(st.message());
    EXPECT_NE(msg.find("outside the allowed roots"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("alpha"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("beta"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("resolves to"), std::string::npos) << msg;
  }
  // A link inside the roots that leads out is refused, not followed, and not described.
  ASSERT_EQ(symlink(t.outside.c_str(), (t.root + "/escape").c_str()), 0);
  auto linked = ExpandPattern(t.root + "/escape/dir/*", t.roots);
  EXPECT_TRUE(absl::IsPermissionDenied(linked.status())) << linked.status();
  EXPECT_EQ(std::string(linked.status().message()).find(t.outside), std::string::npos)
      << linked.status();
  auto star = ExpandPattern(t.root + "/*/dir/*", t.roots);
  EXPECT_TRUE(absl::IsPermissionDenied(star.status())) << star.status();
}

TEST(ExpandPatternTest, BraceExpansionIsBoundedInCountAndTime) {
  Tree t("bounded");
  std::string groups;
  for (int i = 0; i < 21; ++i) groups += "{,}";  // 2^21 alternatives under glob(GLOB_BRACE)
  const absl::Time start = absl::Now();
  auto files = ExpandPattern(t.root + "/a.tok" + groups, t.roots);
  EXPECT_TRUE(absl::IsResourceExhausted(files.status())) << files.status();
  EXPECT_NE(files.status().message().find("more than 1024 alternatives"), std::string::npos);
  // Nested groups multiply too.
  std::string nested = "x";
  for (int i = 0; i < 12; ++i) nested = "{" + nested + "," + nested + "}";
  EXPECT_FALSE(ExpandPattern(t.root + "/" + nested).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));

  ExpandLimits few;
  few.max_entries = 3;
  EXPECT_TRUE(absl::IsResourceExhausted(ExpandPattern(t.root + "/*.tok", {}, few).status()));
  ExpandLimits one;
  one.max_matches = 1;
  EXPECT_TRUE(absl::IsResourceExhausted(ExpandPattern(t.root + "/*.tok", {}, one).status()));
}

TEST(ExpandPatternTest, ACancelledExpansionStops) {
  Tree t("cancelled");
  ExpandLimits limits;
  limits.cancelled = [] { return true; };
  EXPECT_TRUE(absl::IsCancelled(ExpandPattern(t.root + "/{a,b}.tok", {}, limits).status()));
  ExpandLimits no_time;
  no_time.max_time = absl::ZeroDuration();
  EXPECT_TRUE(absl::IsDeadlineExceeded(ExpandPattern(t.root + "/{a,b}.tok", {}, no_time).status()));
}

// The budget is checked at every step of the walk, not only every 256 directory entries read:
// a pattern with many matches spends its time between listings (a stat and a roots check a
// match), which once let a 1 s budget run past 3 s (found by fuzz/data_pattern_fuzzer).
TEST(ExpandPatternTest, TheBudgetIsCheckedAtEveryMatch) {
  Tree t("every_match");
  ASSERT_EQ(mkdir((t.root + "/many").c_str(), 0700), 0);
  for (int i = 0; i < 300; ++i) std::ofstream(absl::StrCat(t.root, "/many/f", i, ".tok")) << "x";
  ASSERT_TRUE(ExpandPattern(t.root + "/many/*.tok", t.roots).ok());
  int polls = 0;
  ExpandLimits limits;
  limits.cancelled = [&polls] { return ++polls > 3; };  // the pattern, its listing, one match
  auto files = ExpandPattern(t.root + "/many/*.tok", t.roots, limits);
  EXPECT_TRUE(absl::IsCancelled(files.status())) << files.status();
  EXPECT_EQ(polls, 4);
}

// A NUL byte ends the C string the system calls read: "<root>/\0/*" would list <root> itself
// (and each "\0" component would lead back to it). Such a path is refused before anything is
// looked at.
TEST(PathPolicyTest, ANulByteIsRefused) {
  Tree t("nul");
  const std::string nul(1, '\0');
  for (const std::string& p : {t.root + "/" + nul + "/*", t.root + "/a.tok" + nul + "x"}) {
    auto files = ExpandPattern(p, t.roots);
    EXPECT_TRUE(absl::IsInvalidArgument(files.status())) << files.status();
    EXPECT_NE(files.status().message().find("a NUL byte at byte"), std::string::npos);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckAllowedPath("job.toml", "data.path", t.root + "/a.tok" + nul, t.roots)));
  EXPECT_TRUE(absl::IsInvalidArgument(ResolveBeneathExisting(t.root + nul).status()));
}

// A path of 300,000 components costs nothing: it is refused by its length.
TEST(PathPolicyTest, LongPathsAreRefusedInConstantTime) {
  Tree t("long");
  std::string path = t.root;
  for (int i = 0; i < 300000; ++i) path += "/a";
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsInvalidArgument(ResolveBeneathExisting(path).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckAllowedPath("job.toml", "k", path, t.roots)));
  EXPECT_TRUE(absl::IsInvalidArgument(ExpandPattern(path + "/*", t.roots).status()));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
}

// The worker's opens: a link that leads out of the roots is refused, also one that appears
// where a directory to be made was checked before.
TEST(PathPolicyTest, OpensAndDirectoriesStayInsideTheRoots) {
  Tree t("open");
  auto fd = OpenInsideRoots(t.root + "/a.tok", O_RDONLY, t.roots);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  ASSERT_EQ(symlink((t.outside + "/secret.tok").c_str(), (t.root + "/link.tok").c_str()), 0);
  EXPECT_TRUE(
      absl::IsPermissionDenied(OpenInsideRoots(t.root + "/link.tok", O_RDONLY, t.roots).status()));
  // A link to a file inside the roots is fine.
  ASSERT_EQ(symlink((t.root + "/b.tok").c_str(), (t.root + "/inner.tok").c_str()), 0);
  fd = OpenInsideRoots(t.root + "/inner.tok", O_RDONLY, t.roots);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);

  const std::string ckpt = t.root + "/ckpt/run1";
  ASSERT_TRUE(MakeDirsInsideRoots(ckpt, t.roots).ok());
  struct stat st;
  ASSERT_EQ(stat(ckpt.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  fd = OpenInsideRoots(ckpt + "/step-1.tmp", O_WRONLY | O_CREAT | O_TRUNC, t.roots);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  // checkpoint.dir replaced by a link after admission.
  ASSERT_EQ(symlink(t.outside.c_str(), (t.root + "/swapped").c_str()), 0);
  absl::Status made = MakeDirsInsideRoots(t.root + "/swapped/ckpt", t.roots);
  EXPECT_TRUE(absl::IsPermissionDenied(made)) << made;
  EXPECT_NE(stat((t.outside + "/ckpt").c_str(), &st), 0) << "nothing made outside";
  EXPECT_TRUE(absl::IsPermissionDenied(
      OpenInsideRoots(t.root + "/swapped/x", O_WRONLY | O_CREAT, t.roots).status()));
}

// A link whose target does not exist is judged by where it points, as any other link: one to a
// missing file outside the roots gets the answer one to an existing file there gets (no
// existence oracle), and one to a missing file inside is fine (issue 53 R1).
TEST(PathPolicyTest, ALinkToAMissingFileIsJudgedByWhereItPoints) {
  Tree t("dangling");
  ASSERT_EQ(symlink((t.outside + "/secret.tok").c_str(), (t.root + "/to-secret").c_str()), 0);
  ASSERT_EQ(symlink((t.outside + "/no-such-file").c_str(), (t.root + "/to-missing").c_str()), 0);
  ASSERT_EQ(symlink("../outside/no/such/dir", (t.root + "/relative-missing").c_str()), 0);
  ASSERT_EQ(symlink((t.root + "/loop-b").c_str(), (t.root + "/loop-a").c_str()), 0);
  ASSERT_EQ(symlink((t.root + "/loop-a").c_str(), (t.root + "/loop-b").c_str()), 0);
  ASSERT_EQ(symlink((t.outside + "/no/../x").c_str(), (t.root + "/to-dotdot").c_str()), 0);
  const absl::Status exists = CheckAllowedPath("job", "k", t.root + "/to-secret", t.roots);
  EXPECT_TRUE(absl::IsPermissionDenied(exists)) << exists;
  for (const char* name : {"to-missing", "relative-missing", "loop-a", "to-dotdot"}) {
    const std::string link = t.root + "/" + name;
    const absl::Status st = CheckAllowedPath("job", "k", link, t.roots);
    EXPECT_EQ(st.code(), exists.code()) << name << ": " << st;
    EXPECT_EQ(st.message(), absl::StrCat("job: k: ", link, " is outside the allowed roots ",
                                         t.roots[0], " (ithacad --allowed-roots)"))
        << name;
    EXPECT_TRUE(absl::IsPermissionDenied(OpenInsideRoots(link, O_RDONLY, t.roots).status()));
    EXPECT_TRUE(absl::IsPermissionDenied(MakeDirsInsideRoots(link + "/d", t.roots))) << name;
  }
  struct stat st;
  EXPECT_NE(stat((t.outside + "/no").c_str(), &st), 0) << "nothing made outside";
  // A link to a file not made yet inside the roots leads inside.
  ASSERT_EQ(symlink((t.root + "/later").c_str(), (t.root + "/to-later").c_str()), 0);
  EXPECT_TRUE(CheckAllowedPath("job", "k", t.root + "/to-later", t.roots).ok());
  auto resolved = ResolveBeneathExisting(t.root + "/to-later/x");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, t.root + "/later/x");
}

TEST(PathPolicyTest, RootsFromTheEnvironment) {
  Tree t("env");
  unsetenv(kAllowedRootsEnv);
  auto none = AllowedRootsFromEnvironment();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  setenv(kAllowedRootsEnv, (t.root + ":" + t.outside).c_str(), 1);
  auto two = AllowedRootsFromEnvironment();
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (std::vector<std::string>{t.root, t.outside}));
  setenv(kAllowedRootsEnv, "/no/such/dir", 1);
  EXPECT_FALSE(AllowedRootsFromEnvironment().ok());
  unsetenv(kAllowedRootsEnv);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

TEST(ResolvePatternTest, EachAlternativeOfALeadingGroupOnItsOwn) {
  EXPECT_EQ(*ResolvePattern("/d", "a.tok"), "/d/a.tok");
  EXPECT_EQ(*ResolvePattern("/d/", "a.tok"), "/d/a.tok");
  EXPECT_EQ(*ResolvePattern("/", "a.tok"), "/a.tok");
  EXPECT_EQ(*ResolvePattern("/d", "/abs/b.tok"), "/abs/b.tok");
  EXPECT_EQ(*ResolvePattern("", "a.tok"), "a.tok");
  EXPECT_EQ(*ResolvePattern("/d", ""), "");
  // A weighted mix: one source per alternative, relative and absolute side by side.
  EXPECT_EQ(*ResolvePattern("/d", "{a.tok,/abs/b.tok}"), "{/d/a.tok,/abs/b.tok}");
  auto sources = SplitDataSources(*ResolvePattern("/d", "{a/*.tok,{/x/c,d}.tok}"));
  ASSERT_TRUE(sources.ok());
  EXPECT_EQ(*sources, (std::vector<std::string>{"/d/a/*.tok", "{/x/c.tok,/d/d.tok}"}));
  // A group inside a path is one path: the prefix goes in front of it.
  EXPECT_EQ(*ResolvePattern("/d", "data/{a,b}.tok"), "/d/data/{a,b}.tok");
  // What follows a leading group goes with every alternative.
  EXPECT_EQ(*ResolvePattern("/d", "{a,/b}/x.tok"), "{/d/a/x.tok,/b/x.tok}");
  EXPECT_FALSE(ResolvePattern("/d", "{a,b").ok());
}

TEST(ResolvePatternTest, PathsAreCleaned) {
  EXPECT_EQ(CleanPath("/x/jobs/../ckpt/"), "/x/ckpt");
  EXPECT_EQ(CleanPath("/x//./y"), "/x/y");
  EXPECT_EQ(CleanPath("/../a"), "/a");
  EXPECT_EQ(CleanPath("../a/./b/.."), "../a");
  EXPECT_EQ(CleanPath("a/.."), ".");
  EXPECT_EQ(CleanPath("/"), "/");
  EXPECT_EQ(CleanPath("/s/j*/../../etc/x"), "/etc/x");
  // One directory, one name: what admission claims for checkpoint.dir.
  EXPECT_EQ(*ResolvePattern("/d", "jobs/../ckpt"), *ResolvePattern("/d", "ckpt"));
  EXPECT_EQ(*ResolvePattern("/d", "/e/./f/"), "/e/f");
  EXPECT_EQ(*ResolvePattern("/d", "{./a,/b/../c}"), "{/d/a,/c}");
}

// A ".." inside a brace group that does not start the pattern is its alternative's: the groups
// are expanded before the paths are cleaned, and the pattern stays one source of a data mix
// (issue 53 R5: "sub/{c.tok,../../mix/a.tok}" became "sub/mix/a.tok}").
TEST(ResolvePatternTest, BraceGroupsAreExpandedBeforePathsAreCleaned) {
  EXPECT_EQ(*ResolvePattern("/d", "sub/{c.tok,../../mix/a.tok}"), "/{d/sub/c.tok,mix/a.tok}");
  EXPECT_EQ(*ResolvePattern("/d", "sub/{c.tok,../mix/a.tok}"), "/d/{sub/c.tok,mix/a.tok}");
  EXPECT_EQ(*ResolvePattern("/d", "sub/{x/../c.tok,d.tok}"), "/d/sub/{c.tok,d.tok}");
  EXPECT_EQ(*ResolvePattern("/d", "/e/{a,b/..}/x.tok"), "/e/{a/x.tok,x.tok}");
  // One alternative left, and a literal comma or brace in an alternative kept literal.
  EXPECT_EQ(*ResolvePattern("/d", "sub/{x/..}/c.tok"), "/d/sub/c.tok");
  EXPECT_EQ(*ResolvePattern("/d", "s/{a,../b}/f\\,g.tok"), "/d/{s/a/f\\,g.tok,b/f\\,g.tok}");
  // Groups without "." or ".." keep their form.
  EXPECT_EQ(*ResolvePattern("/d", "data/{a,b}/*.tok"), "/d/data/{a,b}/*.tok");
  EXPECT_EQ(*ResolvePattern("/d", "./data/{a,b{c,d}}.tok"), "/d/data/{a,b{c,d}}.tok");
  // Past the bounds a pattern is left as it is, for ExpandPattern to refuse naming its key.
  std::string groups;
  for (int i = 0; i < 21; ++i) groups += "{,}";
  EXPECT_EQ(*ResolvePattern("/d", "a.tok" + groups), "/d/a.tok" + groups);
  // Still one source (its group does not start it), and each alternative is what it names.
  for (const std::string& p :
       {std::string("sub/{c.tok,../../mix/a.tok}"), std::string("s/{a,../b}/f\\,g.tok")}) {
    absl::StatusOr<std::string> resolved = ResolvePattern("/d", p);
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    EXPECT_EQ(SplitDataSources(*resolved)->size(), 1u) << *resolved;
  }
  // Each alternative then meets the roots on its own.
  Tree t("braces_dotdot");
  auto outside =
      ExpandPattern(*ResolvePattern(t.root, "shards/{s1.tok,../../outside/secret.tok}"), t.roots);
  EXPECT_TRUE(absl::IsPermissionDenied(outside.status())) << outside.status();
  auto inside = ExpandPattern(*ResolvePattern(t.root, "shards/{s1.tok,../a.tok}"), t.roots);
  ASSERT_TRUE(inside.ok()) << inside.status();
  EXPECT_EQ(*inside, (std::vector<std::string>{t.root + "/a.tok", t.root + "/shards/s1.tok"}));
}

TEST(ResolvePatternTest, AbsoluteOnlyWhenEveryAlternativeIs) {
  EXPECT_TRUE(PatternIsAbsolute("/a.tok"));
  EXPECT_FALSE(PatternIsAbsolute("a.tok"));
  EXPECT_FALSE(PatternIsAbsolute(""));
  EXPECT_TRUE(PatternIsAbsolute("{/a,/b/*.tok}"));
  EXPECT_FALSE(PatternIsAbsolute("{/a,b}"));
  EXPECT_TRUE(PatternIsAbsolute("{/a,/b}/x"));
  EXPECT_FALSE(PatternIsAbsolute("{/a,b"));
}

}  // namespace
}  // namespace ithaca
