#include "engine/spec/overrides.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/spec/job_spec.h"

namespace ithaca {
namespace {

TEST(SpecOverridesTest, SetsKeysAsTomlValuesOrStrings) {
  const std::string spec = "name = \"j\"  # a comment\n[training]\nsteps = 60\nlr = 0.5\n";
  auto same = ApplyOverrides(spec, "job.toml", {});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, spec) << "sent as written without overrides";
  auto out = ApplyOverrides(spec, "job.toml",
                            {"training.steps=5", "memory.offload=true", "data.path=shards/*.tok",
                             "name=\"sweep 3\"", "eval.paths=[\"a.tok\", \"b.tok\"]"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("name = 'sweep 3'"), std::string::npos) << *out;
  EXPECT_NE(out->find("[training]\nlr = 0.5\nsteps = 5\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("[memory]\noffload = true\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("path = 'shards/*.tok'"), std::string::npos) << *out;
  EXPECT_NE(out->find("paths = [ 'a.tok', 'b.tok' ]"), std::string::npos) << *out;

  auto bad = ApplyOverrides(spec, "job.toml", {"training.steps.x=1"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("training.steps is not a table"), absl::string_view::npos)
      << bad.status();
  EXPECT_FALSE(ApplyOverrides(spec, "job.toml", {"steps"}).ok());
  EXPECT_FALSE(ApplyOverrides(spec, "job.toml", {"a..b=1"}).ok());
  auto broken = ApplyOverrides("[training\n", "job.toml", {"a=1"});
  EXPECT_NE(broken.status().message().find("job.toml:1"), absl::string_view::npos)
      << broken.status();
}

// The daemon parses the spec the CLI rewrote; its "(line N)" counted lines of that text. The
// user's view: the line in their own file, or the --set that gave the key.
TEST(SpecOverridesTest, ErrorsPointAtTheUsersLineOrTheirSet) {
  const std::string spec =
      "# a job\n# with comments the rewrite drops\n\nname = \"j\"\n[model]\npreset = \"tiny\"\n"
      "[data]\npath = \"/x.tok\"\nseq_len = 64\n[training]\n# the steps\nsteps = 60\n"
      "lr = -1.0\n";
  const std::vector<std::string> sets = {"training.stepz=3"};
  auto sent = ApplyOverrides(spec, "job.toml", sets);
  ASSERT_TRUE(sent.ok()) << sent.status();
  // The real parser's message on what was sent.
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(*sent, "job.toml");
  ASSERT_FALSE(parsed.ok());
  const std::string msg(parsed.status().message());
  ASSERT_NE(msg.find("training.stepz: unknown key"), std::string::npos) << msg;
  EXPECT_NE(ExplainSpecError(msg, spec, "job.toml", sets).find("(from --set training.stepz=3)"),
            std::string::npos)
      << ExplainSpecError(msg, spec, "job.toml", sets);

  // A key of the file: its line there (13), not in the rewritten text.
  const std::vector<std::string> ok_set = {"training.steps=3"};
  auto sent2 = ApplyOverrides(spec, "job.toml", ok_set);
  ASSERT_TRUE(sent2.ok());
  absl::StatusOr<JobSpec> parsed2 = ParseJobSpec(*sent2, "job.toml");
  ASSERT_FALSE(parsed2.ok());
  const std::string msg2(parsed2.status().message());
  ASSERT_NE(msg2.find("training.lr"), std::string::npos) << msg2;
  ASSERT_EQ(msg2.find("(line 13)"), std::string::npos) << "the rewrite kept the lines? " << msg2;
  const std::string explained = ExplainSpecError(msg2, spec, "job.toml", ok_set);
  EXPECT_NE(explained.find("training.lr: "), std::string::npos) << explained;
  EXPECT_NE(explained.find("(line 13)"), std::string::npos) << explained;
  EXPECT_EQ(ExplainSpecError(msg2, spec, "job.toml", {}), msg2);

  // A misspelt section from --set: the --set is named, not a line past the file's end.
  const std::vector<std::string> section_set = {"trainng.steps=5"};
  auto sent3 = ApplyOverrides(spec, "job.toml", section_set);
  ASSERT_TRUE(sent3.ok()) << sent3.status();
  absl::StatusOr<JobSpec> parsed3 = ParseJobSpec(*sent3, "job.toml");
  ASSERT_FALSE(parsed3.ok());
  const std::string explained3 =
      ExplainSpecError(std::string(parsed3.status().message()), spec, "job.toml", section_set);
  EXPECT_NE(explained3.find("(from --set trainng.steps=5)"), std::string::npos) << explained3;
  EXPECT_EQ(explained3.find("(line "), std::string::npos) << explained3;
  // The Python client's overrides= are named as it names them (issue 54 F7).
  const std::string explained4 = ExplainSpecError(std::string(parsed3.status().message()), spec,
                                                  "job.toml", section_set, "overrides");
  EXPECT_NE(explained4.find("(from overrides trainng.steps=5)"), std::string::npos) << explained4;
  EXPECT_EQ(explained4.find("--set"), std::string::npos) << explained4;
  absl::StatusOr<std::string> bad = ApplyOverrides(spec, "job.toml", {"training"}, "overrides");
  EXPECT_EQ(bad.status().message(),
            "overrides training: expected KEY=VALUE (e.g. training.steps=10)");
}

TEST(SpecOverridesTest, BoundedInNumber) {
  std::vector<std::string> many(kMaxOverrides + 1, "training.steps=1");
  auto out = ApplyOverrides("[training]\nsteps = 2\n", "job.toml", many);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("at most 256"), absl::string_view::npos) << out.status();
  many.pop_back();
  EXPECT_TRUE(ApplyOverrides("[training]\nsteps = 2\n", "job.toml", many).ok());
}

// The guard of toml_text.h holds for an override's key and value too: a key of too many parts,
// and a value toml++ 3.3 would assert on, are refused with a status (no crash).
TEST(SpecOverridesTest, KeysAndValuesGoThroughTheGuard) {
  std::string deep = "a";
  for (int i = 0; i < 100; ++i) deep += ".a";
  auto key = ApplyOverrides("name = \"j\"\n", "job.toml", {deep + "=1"});
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(key.status().message().find("key parts"), absl::string_view::npos) << key.status();
  // "[#" is not TOML: the value is taken as the string it spells.
  auto value = ApplyOverrides("name = \"j\"\n", "job.toml", {"name=[#"});
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_NE(value->find("name = '[#'"), std::string::npos) << *value;
}

}  // namespace
}  // namespace ithaca
