// JobSpec parsing: values, round trip, and that every class of bad input names its key.
#include "engine/spec/job_spec.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/core/file_util.h"
#include "engine/spec/validate.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

// Every key set to a non-default value, so a key the parser drops shows up as a wrong value.
constexpr char kFullSpec[] = R"(
name = "sail-8k"
backend = "cuda"

[model]
preset = "llama-3.2-1b"
config = "cfg/config.json"
weights = "/models/llama"
dtype = "bf16"

[model.rope]
theta = 2000000.0
scaling = "llama3"
factor = 16
low_freq_factor = 2
high_freq_factor = 8
original_max_position_embeddings = 4096

[data]
path = "data/corpus.tok"
seq_len = 8192
micro_batch = 2
shuffle = false
document_mask = true
loss_mask = true

[training]
steps = 500
lr = 1e-3
min_lr = 0          # an integer where a float is expected
warmup_steps = 0
weight_decay = 0.05
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
grad_clip = 0.5
grad_accum = 4
seed = 42

[parallel]
world = 8
sp = 4
fsdp = false

[memory]
recompute = "attention-aware"
offload = true
offload_keep_last = 2
head_chunk = 4
tile_tokens = "auto"
gpu_budget_gib = 70.5
host_budget_gib = 200
optimizer_offload = "auto"
param_offload = true

[checkpoint]
dir = "ckpt"
every = 50
resume = false
keep = 3
export = "bf16"

[metrics]
log_every = 10

[eval]
path = "data/val-*.tok"
every = 25
batches = 4
position_buckets = [1024, 4096]

[eval.passkey]
lengths = [1024, 2048]
depths = [0, 0.5, 1]
samples = 2
keys = [1, 4]

[kernels]
attention_forward = "hopper"
attention_backward = "flash"
)";

absl::Status ParseError(const std::string& toml) { return ParseJobSpec(toml, "job.toml").status(); }

// Parses a minimal valid spec plus `extra` (which may open sections) and returns the status.
absl::Status ErrorWith(const std::string& extra) {
  return ParseError("[data]\npath = \"d.tok\"\n" + extra);
}

void ExpectContains(const absl::Status& st, const std::string& part) {
  EXPECT_NE(std::string(st.message()).find(part), std::string::npos)
      << "\"" << st.message() << "\" lacks \"" << part << "\"";
}

void ExpectError(const absl::Status& st, const std::string& starts_with) {
  ASSERT_FALSE(st.ok()) << "expected an error starting with " << starts_with;
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(std::string(st.message()).rfind(starts_with, 0), 0u) << st.message();
}

TEST(JobSpecTest, FullSpecParsesToTheRightValues) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(kFullSpec);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "sail-8k");
  EXPECT_EQ(s->backend, "cuda");
  EXPECT_EQ(s->model.preset, "llama-3.2-1b");
  EXPECT_EQ(s->model.config, "cfg/config.json");  // ParseJobSpec does not resolve paths
  EXPECT_EQ(s->model.weights, "/models/llama");
  EXPECT_EQ(s->model.dtype, "bf16");
  EXPECT_EQ(s->data.path, "data/corpus.tok");
  EXPECT_EQ(s->data.seq_len, 8192);
  EXPECT_EQ(s->data.micro_batch, 2);
  EXPECT_FALSE(s->data.shuffle);
  EXPECT_TRUE(s->data.document_mask);
  EXPECT_TRUE(s->data.loss_mask);
  EXPECT_EQ(s->training.steps, 500);
  EXPECT_DOUBLE_EQ(s->training.lr, 1e-3);
  EXPECT_DOUBLE_EQ(s->training.min_lr, 0.0);
  EXPECT_EQ(s->training.warmup_steps, 0);
  EXPECT_DOUBLE_EQ(s->training.weight_decay, 0.05);
  EXPECT_DOUBLE_EQ(s->training.beta1, 0.8);
  EXPECT_DOUBLE_EQ(s->training.beta2, 0.99);
  EXPECT_DOUBLE_EQ(s->training.eps, 1e-6);
  EXPECT_DOUBLE_EQ(s->training.grad_clip, 0.5);
  EXPECT_EQ(s->training.grad_accum, 4);
  EXPECT_EQ(s->training.seed, 42u);
  EXPECT_EQ(s->parallel.world, 8);
  EXPECT_EQ(s->parallel.sp, 4);
  EXPECT_FALSE(s->parallel.fsdp);
  EXPECT_EQ(s->memory.recompute, RecomputePolicy::kAttentionAware);
  EXPECT_EQ(s->memory.offload, OffloadChoice::kOn);
  EXPECT_EQ(s->memory.offload_keep_last, 2);
  EXPECT_EQ(s->memory.head_chunk, 4);
  EXPECT_EQ(s->memory.tile_tokens, 0);
  EXPECT_DOUBLE_EQ(s->memory.gpu_budget_gib, 70.5);
  EXPECT_DOUBLE_EQ(s->memory.host_budget_gib, 200.0);
  EXPECT_EQ(s->memory.optimizer_offload, OffloadChoice::kAuto);
  EXPECT_EQ(s->memory.param_offload, OffloadChoice::kOn);
  EXPECT_EQ(s->checkpoint.dir, "ckpt");
  EXPECT_EQ(s->checkpoint.every, 50);
  EXPECT_FALSE(s->checkpoint.resume);
  EXPECT_EQ(s->checkpoint.keep, 3);
  EXPECT_EQ(s->checkpoint.export_dtype, "bf16");
  EXPECT_EQ(s->metrics.log_every, 10);
  EXPECT_EQ(s->eval.path, "data/val-*.tok");
  EXPECT_EQ(s->eval.every, 25);
  EXPECT_EQ(s->eval.batches, 4);
}

TEST(JobSpecTest, DefaultsApplyWhenOnlyDataPathIsGiven) {
  absl::StatusOr<JobSpec> s = ParseJobSpec("[data]\npath = \"d.tok\"\n");
  ASSERT_TRUE(s.ok()) << s.status();
  JobSpec d;  // every other field keeps the struct's default
  d.data.path = "d.tok";
  EXPECT_EQ(JobSpecToToml(*s), JobSpecToToml(d));
  EXPECT_EQ(s->memory.recompute, RecomputePolicy::kAuto);  // the planner's fastest that fits
  EXPECT_EQ(s->data.seq_len, 256);
  EXPECT_TRUE(s->data.shuffle);
  EXPECT_EQ(s->eval.path, "");  // no [eval]: no evaluation
  EXPECT_EQ(JobSpecToToml(*s).find("[eval]"), std::string::npos);
}

TEST(JobSpecTest, RoundTripsThroughToml) {
  absl::StatusOr<JobSpec> a = ParseJobSpec(kFullSpec);
  ASSERT_TRUE(a.ok()) << a.status();
  a->training.lr = 0.1 + 0.2;  // not exactly representable in short decimal: needs 17 digits
  a->training.seed = 18446744073709551615ull;  // above INT64_MAX: written as a string
  a->name = "quote \" and \\ backslash";
  std::string text = JobSpecToToml(*a);
  absl::StatusOr<JobSpec> b = ParseJobSpec(text, "roundtrip.toml");
  ASSERT_TRUE(b.ok()) << b.status() << "\n" << text;
  EXPECT_EQ(JobSpecToToml(*b), text);
  EXPECT_EQ(b->training.lr, 0.1 + 0.2);
  EXPECT_EQ(b->training.seed, 18446744073709551615ull);
  EXPECT_EQ(b->name, "quote \" and \\ backslash");
  EXPECT_EQ(b->memory.head_chunk, 4);
  EXPECT_EQ(b->memory.tile_tokens, 0);
  EXPECT_EQ(b->memory.recompute, RecomputePolicy::kAttentionAware);
  EXPECT_EQ(b->parallel.world, 8);
  EXPECT_FALSE(b->checkpoint.resume);
  EXPECT_EQ(b->checkpoint.export_dtype, "bf16");
  EXPECT_DOUBLE_EQ(b->memory.gpu_budget_gib, 70.5);
  EXPECT_NE(text.find("tile_tokens = \"auto\""), std::string::npos) << text;
  EXPECT_EQ(b->eval.path, "data/val-*.tok");
  EXPECT_EQ(b->eval.every, 25);
  EXPECT_EQ(b->eval.batches, 4);
  EXPECT_EQ(b->eval.position_buckets, (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(b->eval.passkey.keys, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(b->kernels.attention_forward, "hopper");
  EXPECT_EQ(b->kernels.attention_backward, "flash");
}

// The key table drives the reader and the writer: every key JobSpecToToml writes is one the
// parser reads back, and every key's line is in the file (no key written in one place only).
TEST(JobSpecTest, EveryWrittenKeyIsReadBackAndDocumented) {
  absl::StatusOr<JobSpec> a = ParseJobSpec(kFullSpec);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string text = JobSpecToToml(*a);
  const std::string reference = SpecReferenceMarkdown();
  int keys = 0;
  std::string section;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    if (line[0] == '[') {
      section = std::string(line.substr(1, line.size() - 2));
      EXPECT_NE(reference.find("## [" + section + "]"), std::string::npos) << section;
      continue;
    }
    const std::string key(line.substr(0, line.find(" = ")));
    EXPECT_NE(reference.find("| `" + key + "` |"), std::string::npos) << section << "." << key;
    ++keys;
  }
  // With [eval], [eval.passkey], [model.rope], [init] and [kernels]: every key of the table but
  // min_lr_ratio, and model.preset (the full spec's model is a config.json).
  EXPECT_EQ(keys, 71);
}

TEST(JobSpecTest, AttentionKernelsAreChecked) {
  ExpectError(ErrorWith("[kernels]\nattention_forward = \"own\"\n"),
              "job.toml: kernels.attention_forward: must be \"auto\", \"cudnn\", \"hopper\" or "
              "\"flash\", got \"own\"");
  absl::StatusOr<JobSpec> cpu = ParseJobSpec("[data]\npath = \"d.tok\"\n");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(JobSpecToToml(*cpu).find("[kernels]"), std::string::npos);  // nothing to say on a CPU
  cpu->backend = "cuda";
  EXPECT_NE(JobSpecToToml(*cpu).find("[kernels]\nattention_forward = \"auto\""), std::string::npos);
}

// Strings are bounded once, in the parser: a megabyte path or directory is refused before a
// failure reason could repeat it (issue: a 1 MB checkpoint.dir was accepted).
TEST(JobSpecBoundsTest, EveryStringIsBounded) {
  const std::string huge(kMaxSpecStringBytes + 1, 'a');
  for (const std::string key : {"data.path", "checkpoint.dir", "model.weights", "eval.path"}) {
    const size_t dot = key.find('.');
    const std::string section = key.substr(0, dot);
    const std::string spec = "[" + section + "]\n" + key.substr(dot + 1) + " = \"" + huge + "\"\n" +
                             (section == "data" ? "" : "[data]\npath = \"d.tok\"\n");
    absl::Status st = ParseError(spec);
    ExpectError(st, "job.toml: " + key + ": must be at most 4096 bytes, got 4097");
    EXPECT_LT(st.message().size(), 200u);
  }
}

// ithacad died of SIGSEGV on a dotted key of 200,000 parts (toml++ recursed per part).
TEST(JobSpecBoundsTest, DeepDottedKeysAreRefusedNotACrash) {
  std::string key = "a";
  for (int i = 0; i < 200000; ++i) key += ".a";
  ExpectError(ParseError(key + " = 1\n"), "job.toml:1: invalid TOML: a dotted key");
  ExpectError(ParseError("[" + key + "]\n"), "job.toml:1: invalid TOML: a dotted key");
}

TEST(JobSpecTest, RecomputePolicyNames) {
  EXPECT_STREQ(RecomputePolicyName(RecomputePolicy::kNone), "none");
  EXPECT_STREQ(RecomputePolicyName(RecomputePolicy::kFull), "full");
  EXPECT_STREQ(RecomputePolicyName(RecomputePolicy::kAttentionAware), "attention-aware");
  for (const char* p : {"none", "full", "attention-aware"}) {
    absl::StatusOr<JobSpec> s =
        ParseJobSpec(absl::StrCat("[data]\npath = \"d\"\n[memory]\nrecompute = \"", p, "\"\n"));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_STREQ(RecomputePolicyName(s->memory.recompute), p);
  }
  ExpectError(ErrorWith("[memory]\nrecompute = \"some\"\n"), "job.toml: memory.recompute: ");
}

// A spec whose model is a config.json is written without the preset it ignores.
TEST(JobSpecTest, ConfigIsWrittenWithoutThePreset) {
  JobSpec s;
  s.model.config = "/models/m/config.json";
  s.data.path = "/data/train.tok";
  const std::string toml = JobSpecToToml(s);
  EXPECT_EQ(toml.find("preset"), std::string::npos) << toml;
  EXPECT_NE(toml.find("config = \"/models/m/config.json\""), std::string::npos) << toml;
  absl::StatusOr<JobSpec> back = ParseJobSpec(toml, "resolved.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model.config, s.model.config);
  EXPECT_NE(JobSpecToToml(JobSpec()).find("preset = \"tiny\""), std::string::npos);
}

// A key of one section written in another (or at the top) is named where it belongs.
TEST(JobSpecTest, AKeyInTheWrongSectionIsNamedWhereItBelongs) {
  absl::StatusOr<JobSpec> s = ParseJobSpec("lr = 1e-3\n[data]\npath = \"d\"\n", "job.toml");
  ASSERT_FALSE(s.ok());
  ExpectContains(s.status(), "job.toml: lr: unknown key");
  ExpectContains(s.status(), "did you mean training.lr? (it belongs under [training])");
  ExpectContains(ErrorWith("[model]\nseq_len = 128\n"), "did you mean data.seq_len?");
}

// Issue 30: "checkpoint" named three things. memory.checkpoint and memory.checkpoint_interval are
// now memory.recompute and memory.recompute_interval; the old keys are refused naming the new.
TEST(JobSpecTest, RenamedKeysAreRefusedNamingTheirNewNames) {
  absl::Status st = ErrorWith("[memory]\ncheckpoint = \"full\"\n");
  ExpectError(st, "job.toml: memory.checkpoint: renamed key (line 4)");
  ExpectContains(st, "did you mean memory.recompute?");
  st = ErrorWith("[memory]\ncheckpoint_interval = 2\n");
  ExpectError(st, "job.toml: memory.checkpoint_interval: renamed key");
  ExpectContains(st, "did you mean memory.recompute_interval?");
  // A typo of an old name, and the other trainers' names of the idea, find it too.
  ExpectContains(ErrorWith("[memory]\ncheckpont = \"full\"\n"), "did you mean memory.recompute?");
  ExpectContains(ErrorWith("[memory]\nactivation_checkpointing = \"full\"\n"),
                 "did you mean memory.recompute?");
  ExpectContains(ErrorWith("[memory]\ngradient_checkpointing = \"full\"\n"),
                 "did you mean memory.recompute?");
  // The saved training state keeps its name: [checkpoint] is still a section, and no other
  // section's "checkpoint" turns into a recompute hint.
  ExpectError(ErrorWith("[training]\ncheckpoint = 1\n"),
              "job.toml: training.checkpoint: unknown key");
  EXPECT_EQ(std::string(ErrorWith("[training]\ncheckpoint = 1\n").message()).find("recompute"),
            std::string::npos);

  // The new keys work.
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[data]\npath = \"d\"\n[memory]\nrecompute = \"attention-aware\"\nrecompute_interval = 4\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->memory.recompute, RecomputePolicy::kAttentionAware);
  EXPECT_EQ(s->memory.recompute_interval, 4);
  ExpectError(ErrorWith("[memory]\nrecompute_interval = 0\n"),
              "job.toml: memory.recompute_interval: must be an integer >= 1 or \"auto\", got 0");
}

TEST(JobSpecTest, SavedBlockInputs) {
  absl::StatusOr<JobSpec> s =
      ParseJobSpec("[data]\npath = \"d\"\n[memory]\nsaved_block_inputs = 6\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->memory.saved_block_inputs, 6);
  auto again = ParseJobSpec(JobSpecToToml(*s));  // what a worker receives
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->memory.saved_block_inputs, 6);
  ExpectError(ErrorWith("[memory]\nsaved_block_inputs = 1\n"),
              "job.toml: memory.saved_block_inputs: must be 0 (off) or >= 2, got 1");
  ExpectError(ErrorWith("[memory]\nsaved_block_inputs = 4\nrecompute_interval = 2\n"),
              "job.toml: memory.saved_block_inputs: set it or memory.recompute_interval, not both");
  ExpectError(ErrorWith("[memory]\nsaved_block_inputs = 4\nrecompute = \"none\"\n"),
              "job.toml: memory.saved_block_inputs: needs memory.recompute \"full\"");
}

// A spec stored by the previous version (JobSpecToToml's text with the keys of then) reads as
// the same spec after UpgradeStoredSpec; today's text passes through unchanged.
TEST(JobSpecTest, UpgradeStoredSpecReadsTheOldKeysUnderTheNewNames) {
  absl::StatusOr<JobSpec> full = ParseJobSpec(kFullSpec);
  ASSERT_TRUE(full.ok()) << full.status();
  JobSpec want = *full;
  want.memory.recompute_interval = 3;
  const std::string today = JobSpecToToml(want);
  EXPECT_EQ(UpgradeStoredSpec(today), today);
  // What the previous ithacad wrote: the same lines, under the old names.
  ASSERT_NE(today.find("\nrecompute = \"attention-aware\"\n"), std::string::npos) << today;
  ASSERT_NE(today.find("\nrecompute_interval = 3\n"), std::string::npos) << today;
  const std::string stored =
      absl::StrReplaceAll(today, {{"\nrecompute = ", "\ncheckpoint = "},
                                  {"\nrecompute_interval = ", "\ncheckpoint_interval = "}});
  ASSERT_NE(stored, today);
  ExpectContains(ParseJobSpec(stored).status(), "did you mean memory.recompute?");

  const std::string upgraded = UpgradeStoredSpec(stored);
  absl::StatusOr<JobSpec> read = ParseJobSpec(upgraded, "stored");
  ASSERT_TRUE(read.ok()) << read.status() << "\n" << upgraded;
  EXPECT_EQ(read->memory.recompute, RecomputePolicy::kAttentionAware);
  EXPECT_EQ(read->memory.recompute_interval, 3);
  EXPECT_EQ(JobSpecToToml(*read), today);  // every other key as it was

  // Text that does not parse, or holds both spellings, is left for the parser to report.
  EXPECT_EQ(UpgradeStoredSpec("[memory\ncheckpoint = 1"), "[memory\ncheckpoint = 1");
  const std::string both = "[memory]\ncheckpoint = \"none\"\nrecompute = \"full\"\n";
  EXPECT_EQ(UpgradeStoredSpec(both), both);
}

TEST(JobSpecTest, UnknownKeyInEachSectionNamesItsPath) {
  ExpectError(ParseError("nmae = \"x\"\n[data]\npath = \"d\"\n"), "job.toml: nmae: unknown key");
  for (const char* section :
       {"model", "data", "training", "parallel", "memory", "checkpoint", "metrics", "eval"}) {
    std::string toml = absl::StrCat("[data]\npath = \"d\"\n[", section, "]\nbogus_key = 1\n");
    if (std::string(section) == "data") toml = "[data]\npath = \"d\"\nbogus_key = 1\n";
    ExpectError(ParseError(toml), absl::StrCat("job.toml: ", section, ".bogus_key: unknown key"));
  }
}

TEST(JobSpecTest, UnknownKeySuggestsTheClosestKey) {
  absl::Status st = ErrorWith("[training]\nlerning_rate = 0.1\n");
  ExpectError(st, "job.toml: training.lerning_rate: unknown key");
  ExpectContains(st, "did you mean training.lr?");
  ExpectContains(st, "line 4");
  st = ErrorWith("[training]\nwarmup_step = 3\n");
  ExpectContains(st, "did you mean training.warmup_steps?");
  st = ErrorWith("[memory]\nzzz = 3\n");
  EXPECT_EQ(std::string(st.message()).find("did you mean"), std::string::npos) << st;
}

TEST(JobSpecTest, UnknownSection) {
  absl::Status st = ErrorWith("[trainig]\nsteps = 3\n");
  ExpectError(st, "job.toml: trainig: unknown section");
  ExpectContains(st, "did you mean training?");
  ExpectError(ErrorWith("[optimizer]\nlr = 3\n"), "job.toml: optimizer: unknown section");
  ExpectError(ErrorWith("[training.inner]\nx = 1\n"), "job.toml: training.inner: unknown key");
}

TEST(JobSpecTest, WrongTypes) {
  struct Case {
    std::string toml;
    const char* prefix;
  } cases[] = {
      {"[training]\nsteps = \"ten\"", "job.toml: training.steps: must be an integer, got string"},
      {"[training]\nsteps = 10.0", "job.toml: training.steps: must be an integer, got float"},
      {"[training]\nlr = true", "job.toml: training.lr: must be a number, got boolean"},
      {"[training]\nlr = nan", "job.toml: training.lr: must be a finite number"},
      {"[training]\nseed = -1", "job.toml: training.seed: must be >= 0"},
      {"[parallel]\nfsdp = 1", "job.toml: parallel.fsdp: must be a boolean, got integer"},
      {"[model]\npreset = 3", "job.toml: model.preset: must be a string, got integer"},
      {"[memory]\nrecompute = [1]", "job.toml: memory.recompute: must be a string, got array"},
      {"[memory]\ntile_tokens = 1.5", "job.toml: memory.tile_tokens: must be an integer >= 1"},
      {"[checkpoint]\nevery = 1979-05-27",
       "job.toml: checkpoint.every: must be an integer, got date"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.toml);
    ExpectError(ErrorWith(c.toml), c.prefix);
  }
  ExpectError(ParseError("model = 3\n[data]\npath = \"d\"\n"),
              "job.toml: model: must be a table, got integer");
  ExpectError(ParseError("[name]\nx = 1\n[data]\npath = \"d\"\n"),
              "job.toml: name: must be a string, got table");
}

TEST(JobSpecTest, RangeChecksNameTheKey) {
  struct Case {
    const char* toml;
    const char* prefix;
  } cases[] = {
      {"[training]\nsteps = -1", "job.toml: training.steps: must be >= 0, got -1"},
      {"[training]\nsteps = 0",
       "job.toml: training.steps: 0 (an evaluation-only job) needs an [eval] section with "
       "eval.path"},
      {"[training]\nlr = -1", "job.toml: training.lr: must be > 0, got -1"},
      {"[training]\nlr = 0",
       "job.toml: training.lr: must be > 0, got 0 (0 only for an evaluation-only job, "
       "training.steps = 0)"},
      {"[training]\nlr = 0\n[eval]\npath = \"v.tok\"", "job.toml: training.lr: must be > 0"},
      {"[training]\nsteps = 0\nlr = -1\n[eval]\npath = \"v.tok\"",
       "job.toml: training.lr: must be > 0, got -1"},
      {"[training]\nsteps = 0\nlr = 0\n[checkpoint]\ndir = \"c\"\nexport = \"bf16\"\n"
       "[eval]\npath = \"v.tok\"",
       "job.toml: checkpoint.export: an evaluation-only job (training.steps = 0) writes no "
       "checkpoint"},
      {"[eval]\nevery = 5", "job.toml: eval.path: required in an [eval] section"},
      {"[eval.passkey]\nsamples = 2",
       "job.toml: eval.passkey.lengths: required in an [eval.passkey] section"},
      {"[eval.passkey]\nlengths = [128, 300]",
       "job.toml: eval.passkey.lengths: 300 is not in [1, data.seq_len = 256]"},
      {"[parallel]\nworld = 2\nsp = 2\n[eval.passkey]\nlengths = [128, 201]",
       "job.toml: eval.passkey.lengths: 201 is not divisible by parallel.sp (2)"},
      {"[eval.passkey]\nlengths = [128, 128]",
       "job.toml: eval.passkey.lengths: 128 is given twice"},
      {"[eval.passkey]\nlengths = [128]\ndepths = [0, 1.5]",
       "job.toml: eval.passkey.depths: 1.5 is not in [0, 1]"},
      {"[eval.passkey]\nlengths = [128]\ndepths = []",
       "job.toml: eval.passkey.depths: must hold 1 to 64 depths, got 0"},
      {"[eval.passkey]\nlengths = [128]\nsamples = 0",
       "job.toml: eval.passkey.samples: must be in [1, 4096], got 0"},
      {"[eval.passkey]\nlengths = [128.5]", "job.toml: eval.passkey.lengths: "},
      {"[eval.passkey]\nlengths = [128]\nkeys = []",
       "job.toml: eval.passkey.keys: must hold 1 to 8 counts, got 0"},
      {"[eval.passkey]\nlengths = [128]\nkeys = [1, 65]",
       "job.toml: eval.passkey.keys: 65 is not in [1, 64]"},
      {"[eval.passkey]\nlengths = [128]\nkeys = [4, 4]",
       "job.toml: eval.passkey.keys: 4 is given twice"},
      {"[eval.passkey]\nlenghts = [128]", "job.toml: eval.passkey.lenghts: unknown key"},
      {"[eval]\npath = \"\"", "job.toml: eval.path: required in an [eval] section"},
      {"[eval.passkey]\nlengths = [128]\n[eval]\nposition_buckets = [64]",
       "job.toml: eval.position_buckets: needs eval.path: it splits the held-out loss by "
       "position"},
      {"[eval]\npath = \"v.tok\"\nposition_buckets = [64, 256]",
       "job.toml: eval.position_buckets: 256 is not in [1, data.seq_len = 256)"},
      {"[eval]\npath = \"v.tok\"\nposition_buckets = [0]",
       "job.toml: eval.position_buckets: 0 is not in [1, data.seq_len = 256)"},
      {"[eval]\npath = \"v.tok\"\nposition_buckets = [128, 64]",
       "job.toml: eval.position_buckets: 64 follows 128: the bounds must increase"},
      {"[eval]\npath = \"v.tok\"\nposition_buckets = [64, 64]",
       "job.toml: eval.position_buckets: 64 follows 64: the bounds must increase"},
      {"[eval]\npath = \"v.tok\"\nevery = -1", "job.toml: eval.every: must be >= 0"},
      {"[eval]\npath = \"v.tok\"\nbatches = 0",
       "job.toml: eval.batches: must be in [1, 1048576], got 0"},
      {"[eval]\npath = \"v.tok\"\nbatches = 1048577",
       "job.toml: eval.batches: must be in [1, 1048576]"},
      {"[training]\nmin_lr = -0.1", "job.toml: training.min_lr: must be >= 0"},
      {"[training]\nlr = 0.1\nmin_lr = 0.2", "job.toml: training.min_lr: must be <= training.lr"},
      {"[training]\nmin_lr = 1e-6\nmin_lr_ratio = 0.1",
       "job.toml: training.min_lr_ratio: set either training.min_lr (absolute) or "
       "training.min_lr_ratio (of training.lr), not both"},
      {"[training]\nmin_lr_ratio = 1.5", "job.toml: training.min_lr_ratio: must be in [0, 1]"},
      {"[training]\nschedule = \"step\"",
       "job.toml: training.schedule: must be \"cosine\", \"linear\", \"wsd\" or \"constant\", "
       "got \"step\""},
      {"[training]\ndecay_ratio = 2", "job.toml: training.decay_ratio: must be in [0, 1]"},
      {"[training]\nwarmup_steps = -1", "job.toml: training.warmup_steps: must be >= 0"},
      {"[training]\nweight_decay = -1", "job.toml: training.weight_decay: must be >= 0"},
      {"[training]\nbeta1 = 1", "job.toml: training.beta1: must be in [0, 1)"},
      {"[training]\nbeta1 = -0.1", "job.toml: training.beta1: must be in [0, 1)"},
      {"[training]\nbeta2 = 1.5", "job.toml: training.beta2: must be in [0, 1)"},
      {"[training]\neps = 0", "job.toml: training.eps: must be > 0"},
      {"[training]\ngrad_clip = -1", "job.toml: training.grad_clip: must be >= 0"},
      {"[training]\ngrad_accum = 0",
       "job.toml: training.grad_accum: must be in [1, 1048576], got 0"},
      {"[data]\nseq_len = 1", "job.toml: data.seq_len: must be in [2, 134217728], got 1"},
      {"[data]\nmicro_batch = 0", "job.toml: data.micro_batch: must be in [1, 4096], got 0"},
      {"[parallel]\nworld = 0", "job.toml: parallel.world: must be in [1, 65536], got 0"},
      {"[parallel]\nsp = 0", "job.toml: parallel.sp: must be >= 1"},
      {"[parallel]\nworld = 8\nsp = 3", "job.toml: parallel.sp: must divide parallel.world (8)"},
      {"backend = \"tpu\"", "job.toml: backend: must be \"cpu\" or \"cuda\", got \"tpu\""},
      {"name = \"\"", "job.toml: name: must not be empty"},
      {"[model]\ndtype = \"f16\"", "job.toml: model.dtype: must be \"auto\", \"bf16\" or \"f32\""},
      {"[model]\npreset = \"llama-2-7b\"", "job.toml: model.preset: must be \"tiny\""},
      {"[memory]\nhead_chunk = 0", "job.toml: memory.head_chunk: must be an integer >= 1"},
      {"[memory]\nhead_chunk = \"max\"", "job.toml: memory.head_chunk: must be an integer >= 1"},
      {"[memory]\ntile_tokens = -4", "job.toml: memory.tile_tokens: must be an integer >= 1"},
      {"[memory]\noffload_keep_last = -1",
       "job.toml: memory.offload_keep_last: must be an integer >= 0 or \"auto\", got -1"},
      {"[memory]\ngpu_budget_gib = -1", "job.toml: memory.gpu_budget_gib: must be >= 0"},
      {"[memory]\nhost_budget_gib = -1", "job.toml: memory.host_budget_gib: must be >= 0"},
      {"[memory]\noptimizer_offload = \"yes\"",
       "job.toml: memory.optimizer_offload: must be true, false or \"auto\", got \"yes\""},
      {"[memory]\noptimizer_offload = 1",
       "job.toml: memory.optimizer_offload: must be true, false or \"auto\", got integer"},
      {"[memory]\nparam_offload = \"host\"",
       "job.toml: memory.param_offload: must be true, false or \"auto\", got \"host\""},
      {"[checkpoint]\nevery = -1", "job.toml: checkpoint.every: must be >= 0"},
      {"[checkpoint]\nkeep = 0", "job.toml: checkpoint.keep: must be >= 1"},
      {"[checkpoint]\ndir = \"c\"\nexport = \"fp8\"",
       "job.toml: checkpoint.export: must be \"bf16\" or \"f32\", got \"fp8\""},
      {"[checkpoint]\nexport = \"f32\"", "job.toml: checkpoint.export: needs checkpoint.dir"},
      {"[metrics]\ntensorboard = true", "job.toml: metrics.tensorboard: needs checkpoint.dir"},
      {"[metrics]\nlog_every = 0", "job.toml: metrics.log_every: must be >= 1"},
      {"[retry]\nmax_restarts = -1", "job.toml: retry.max_restarts: must be in [0, 1000]"},
      {"[retry]\nbackoff_seconds = -2", "job.toml: retry.backoff_seconds: must be in [0, 86400]"},
      {"[retry]\nmax_retries = 2", "job.toml: retry.max_retries"},
      {"[slurm]\nnodes = 0", "job.toml: slurm.nodes: must be in [1, 4096], got 0"},
      {"[slurm]\nnodes = 3", "job.toml: slurm.nodes: must divide parallel.world (1), got 3"},
      {"[slurm]\nsignal_grace = -1", "job.toml: slurm.signal_grace: must be in [0, 86400], got -1"},
      // Each would add an sbatch option of its own on the batch script's #SBATCH line.
      {"[slurm]\npartition = \"gpu --uid=0\"",
       "job.toml: slurm.partition: \"gpu --uid=0\" is not a valid slurm.partition (letters"},
      {"[slurm]\naccount = \"a\\nb\"", "job.toml: slurm.account: "},
      {"[slurm]\nconstraint = \"h100'\"", "job.toml: slurm.constraint: "},
      {"[slurm]\ntime_limit = \"1 day\"",
       "job.toml: slurm.time_limit: \"1 day\" is not a valid slurm.time_limit (sbatch --time"},
      {"[slurm]\ntime_limit = \"1:2:3:4\"", "job.toml: slurm.time_limit: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.toml);
    // Top-level keys must come before the first table header.
    std::string toml = c.toml[0] == '[' ? std::string("[data]\npath = \"d\"\n") + c.toml
                                        : std::string(c.toml) + "\n[data]\npath = \"d\"\n";
    if (std::string(c.toml).rfind("[data]", 0) == 0) {
      toml = std::string(c.toml) + "\npath = \"d\"\n";
    }
    ExpectError(ParseError(toml), c.prefix);
  }
}

// A key's range is written once, in its row of the key table: Validate enforces it with the one
// message, and the reference (docs/spec.md) shows it in the key's kind. Without the row's range
// both expectations fail.
TEST(JobSpecTest, RangeInTheKeyTableIsEnforcedAndDocumented) {
  const std::string reference = SpecReferenceMarkdown();
  struct Case {
    std::string section, key, kind, good, bad, error;
  } cases[] = {
      {"training", "beta1", "a number in [0, 1)", "0", "1",
       "job.toml: training.beta1: must be in [0, 1), got 1.0 (line 4)"},
      {"retry", "max_restarts", "an integer in [0, 1000]", "1000", "1001",
       "job.toml: retry.max_restarts: must be in [0, 1000], got 1001 (line 4)"},
      {"memory", "saved_block_inputs", "an integer, 0 (off) or >= 2", "0", "1",
       "job.toml: memory.saved_block_inputs: must be 0 (off) or >= 2, got 1 (line 4)"},
      {"training", "grad_clip", "a number >= 0 (0 disables clipping)", "0", "-0.5",
       "job.toml: training.grad_clip: must be >= 0 (0 disables clipping), got -0.5 (line 4)"},
      // Checked only where given: the default, 0, is the model's own.
      {"model.rope", "theta", "a number > 0 when given", "1e6", "0",
       "job.toml: model.rope.theta: must be > 0, got 0.0 (line 4)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.section + "." + c.key);
    const std::string at = "[" + c.section + "]\n" + c.key + " = ";
    EXPECT_TRUE(ErrorWith(at + c.good + "\n").ok()) << ErrorWith(at + c.good + "\n");
    const absl::Status bad = ErrorWith(at + c.bad + "\n");
    ExpectError(bad, c.error);
    EXPECT_EQ(std::string(bad.message()), c.error);
    const std::string row = "| `" + c.key + "` | " + c.kind + " |";
    EXPECT_NE(reference.find(row), std::string::npos) << "the reference lacks " << row;
  }
}

TEST(JobSpecTest, RangeErrorGivesTheLine) {
  absl::Status st = ErrorWith("[training]\nsteps = 10\nlr = -1\n");
  ExpectError(st, "job.toml: training.lr: must be > 0, got -1");
  ExpectContains(st, "(line 5)");
}

TEST(JobSpecTest, HeadChunkAutoAndInteger) {
  absl::StatusOr<JobSpec> s =
      ParseJobSpec("[data]\npath = \"d\"\n[memory]\nhead_chunk = \"auto\"\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->memory.head_chunk, 0);
  s = ParseJobSpec("[data]\npath = \"d\"\n[memory]\nhead_chunk = 4\ntile_tokens = 1024\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->memory.head_chunk, 4);
  EXPECT_EQ(s->memory.tile_tokens, 1024);
}

TEST(JobSpecTest, BadTomlGivesLineAndColumn) {
  absl::Status st = ParseError("name = \"x\"\n[data]\npath = \"d\"\nseq_len = = 3\n");
  ExpectError(st, "job.toml:4:");
  ExpectContains(st, "invalid TOML");
  st = ParseError("[data]\npath = \"d\"\n[data]\n");  // duplicate table
  ExpectError(st, "job.toml:3:");
}

TEST(JobSpecTest, MissingDataPath) {
  ExpectError(ParseError("name = \"x\"\n"), "job.toml: data.path: required");
  ExpectError(ParseError("[data]\nseq_len = 64\n"), "job.toml: data.path: required");
  ExpectError(ParseError("[data]\npath = \"\"\n"), "job.toml: data.path: required");
}

// training.steps = 0 with an [eval] section: evaluate the model once and stop. The learning
// rates do not matter then (lr may be 0, below the default min_lr), and there is no training
// data to require.
TEST(JobSpecTest, EvaluationOnlyJob) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[training]\nsteps = 0\nlr = 0\n[eval]\npath = \"val.tok\"\n[data]\nseq_len = 64\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->training.steps, 0);
  EXPECT_EQ(s->training.lr, 0);
  EXPECT_EQ(s->data.path, "");
  EXPECT_EQ(s->eval.path, "val.tok");
  EXPECT_EQ(s->eval.batches, 8);
  EXPECT_EQ(s->eval.every, 0);
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToToml(*s), "roundtrip.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(JobSpecToToml(*back), JobSpecToToml(*s));
  // With data and a learning rate it is just as valid.
  EXPECT_TRUE(ParseJobSpec("[data]\npath = \"d\"\n[training]\nsteps = 0\n[eval]\n"
                           "path = \"v\"\n")
                  .ok());
  // Without [eval] a job must train.
  ExpectError(ParseError("[training]\nsteps = 0\nlr = 0\n"),
              "job.toml: training.steps: 0 (an evaluation-only job) needs an [eval] section");
  ExpectError(ParseError("[training]\nlr = 0\n[eval]\npath = \"v\"\n"),
              "job.toml: data.path: "
              "required");
}

// data.weights: one weight per alternative of data.path's brace group, exact in whole samples.
// [eval.passkey] alone: an evaluation-only job needs neither data.path nor eval.path, and the
// section survives the stored spec (the [eval] header too, for eval.every).
TEST(JobSpecTest, PasskeyEvalAloneRoundTrips) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[training]\nsteps = 0\nlr = 0\n[data]\nseq_len = 4096\n[eval]\nevery = 3\n"
      "[eval.passkey]\nlengths = [1024, 4096]\nsamples = 2\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->eval.passkey.lengths, (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(s->eval.passkey.depths, (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(s->eval.passkey.samples, 2);
  EXPECT_EQ(s->eval.passkey.keys, std::vector<int64_t>{1});  // the passkey test alone
  const std::string toml = JobSpecToToml(*s);
  EXPECT_NE(toml.find("[eval]\npath = \"\"\nevery = 3\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("[eval.passkey]\nlengths = [1024, 4096]\ndepths = [0.0, 0.25, 0.5, 0.75, "
                      "1.0]\nsamples = 2\nkeys = [1]\n"),
            std::string::npos)
      << toml;
  absl::StatusOr<JobSpec> back = ParseJobSpec(toml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->eval.passkey.lengths, s->eval.passkey.lengths);
  EXPECT_EQ(back->eval.every, 3);
  // Without it nothing is written.
  absl::StatusOr<JobSpec> plain = ParseJobSpec("[data]\npath = \"d.tok\"\n");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(JobSpecToToml(*plain).find("passkey"), std::string::npos);
}

TEST(JobSpecTest, DataWeightsNameTheSourcesOfTheBraceGroup) {
  absl::StatusOr<JobSpec> s =
      ParseJobSpec("[data]\npath = \"{web/*.tok,code/{a,b}.tok}\"\nweights = [0.7, 0.3]\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->data.weights, (std::vector<double>{0.7, 0.3}));
  EXPECT_EQ(*DataMixSlots(s->data.weights), (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(*DataMixSlots({3, 1}), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(*DataMixSlots({0.25, 0.25, 0.5}), (std::vector<int64_t>{1, 1, 2}));
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToToml(*s), "roundtrip.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data.weights, s->data.weights);
  EXPECT_TRUE(ParseJobSpec("[data]\npath = \"d\"\n")->data.weights.empty());
  for (const auto& [toml, error] : std::vector<std::pair<std::string, std::string>>{
           {"path = \"{a.tok,b.tok,c.tok}\"\nweights = [1, 2]",
            "job.toml: data.weights: 2 weights for 3 sources: data.path must be one brace group "
            "with a source per weight"},
           {"path = \"d/{a,b}.tok\"\nweights = [1, 2]",
            "job.toml: data.weights: 2 weights for 1 source"},
           {"path = \"{a.tok,b.tok}\"\nweights = [1, 0]",
            "job.toml: data.weights: must be positive numbers, got 0"},
           {"path = \"{a.tok,b.tok}\"\nweights = [0.12345, 1]",
            "job.toml: data.weights: at most 3 decimals each"},
           {"path = \"{a.tok,b.tok}\"\nweights = [1, \"x\"]",
            "job.toml: data.weights: must be an array of numbers, got string"},
           {"path = \"{a.tok,b.tok}\"\nweights = [999999.5, 1]",
            "job.toml: data.weights: the mix repeats only every"},
       }) {
    absl::StatusOr<JobSpec> bad = ParseJobSpec("[data]\n" + toml + "\n");
    ASSERT_FALSE(bad.ok()) << toml;
    EXPECT_NE(bad.status().message().find(error), std::string::npos) << bad.status();
  }
}

// data.source_loss_mask: per source of the mix, SFT (masked) or pretraining (every label).
TEST(JobSpecTest, SourceLossMaskIsOnePerSourceOfAMix) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[data]\npath = \"{web/*.tok,sft.tok}\"\nweights = [3, 1]\nsource_loss_mask = [false, "
      "true]\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->data.source_loss_mask, (std::vector<bool>{false, true}));
  const std::string toml = JobSpecToToml(*s);
  EXPECT_NE(toml.find("source_loss_mask = [false, true]\n"), std::string::npos) << toml;
  absl::StatusOr<JobSpec> back = ParseJobSpec(toml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data.source_loss_mask, s->data.source_loss_mask);
  EXPECT_TRUE(ParseJobSpec("[data]\npath = \"d\"\n")->data.source_loss_mask.empty());
  for (const auto& [toml, error] : std::vector<std::pair<std::string, std::string>>{
           {"path = \"d.tok\"\nsource_loss_mask = [true]",
            "job.toml: data.source_loss_mask: needs a mix (data.weights, one source per value); "
            "for one source use data.loss_mask"},
           {"path = \"{a.tok,b.tok}\"\nweights = [1, 1]\nsource_loss_mask = [true]",
            "job.toml: data.source_loss_mask: 1 value for 2 sources (data.weights): one per "
            "source"},
           {"path = \"{a.tok,b.tok}\"\nweights = [1, 1]\nloss_mask = true\n"
            "source_loss_mask = [false, true]",
            "job.toml: data.source_loss_mask: set either data.loss_mask = true (every source "
            "masked) or data.source_loss_mask (per source), not both"},
           {"path = \"{a.tok,b.tok}\"\nweights = [1, 1]\nsource_loss_mask = [1, 0]",
            "job.toml: data.source_loss_mask: must be an array of booleans, got integer"},
       }) {
    absl::StatusOr<JobSpec> bad = ParseJobSpec("[data]\n" + toml + "\n");
    ASSERT_FALSE(bad.ok()) << toml;
    EXPECT_NE(bad.status().message().find(error), std::string::npos) << bad.status();
  }
}

TEST(JobSpecTest, RetryPolicyDefaultsToNoRestartAndRoundTrips) {
  absl::StatusOr<JobSpec> none = ParseJobSpec("[data]\npath = \"d\"\n");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->retry.max_restarts, 0);
  EXPECT_EQ(none->retry.backoff_seconds, 10);
  absl::StatusOr<JobSpec> s =
      ParseJobSpec("[data]\npath = \"d\"\n[retry]\nmax_restarts = 3\nbackoff_seconds = 0.5\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->retry.max_restarts, 3);
  EXPECT_EQ(s->retry.backoff_seconds, 0.5);
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToToml(*s), "roundtrip.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->retry.max_restarts, 3);
  EXPECT_EQ(back->retry.backoff_seconds, 0.5);
}

TEST(JobSpecTest, SlurmSectionIsWrittenOnlyWhenSetAndRoundTrips) {
  absl::StatusOr<JobSpec> none = ParseJobSpec("[data]\npath = \"d\"\n");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->slurm.nodes, 1);
  EXPECT_EQ(JobSpecToToml(*none).find("[slurm]"), std::string::npos);
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "[data]\npath = \"d\"\n[parallel]\nworld = 4\n[slurm]\nnodes = 2\npartition = \"gpu,debug\"\n"
      "account = \"proj-1\"\ntime_limit = \"1-02:30:00\"\nconstraint = \"h100&[ib1|ib2]\"\n");
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<JobSpec> back = ParseJobSpec(JobSpecToToml(*s), "roundtrip.toml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->slurm.nodes, 2);
  EXPECT_EQ(back->slurm.partition, "gpu,debug");
  EXPECT_EQ(back->slurm.account, "proj-1");
  EXPECT_EQ(back->slurm.time_limit, "1-02:30:00");
  EXPECT_EQ(back->slurm.constraint, "h100&[ib1|ib2]");
  for (const char* ok : {"30", "30:00", "1:00:00", "2-12", "2-12:30", "2-12:30:00"}) {
    EXPECT_TRUE(CheckSlurmValue("slurm.time_limit", ok, "t").ok()) << ok;
  }
  EXPECT_EQ(CheckSlurmValue("slurm.partition", "a b", "--slurm-partition").message(),
            "--slurm-partition: \"a b\" is not valid (letters, digits and _ . , -, at most 256)");
}

TEST(JobSpecTest, LoadResolvesRelativePathsAgainstTheSpecDirectory) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/jobdir");
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::string path = dir + "/job.toml";
  ASSERT_TRUE(WriteFileAtomic(path, kFullSpec).ok());
  absl::StatusOr<JobSpec> s = LoadJobSpec(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->data.path, dir + "/data/corpus.tok");
  EXPECT_EQ(s->model.config, dir + "/cfg/config.json");
  EXPECT_EQ(s->model.weights, "/models/llama");  // absolute: unchanged
  EXPECT_EQ(s->checkpoint.dir, dir + "/ckpt");
  EXPECT_EQ(s->eval.path, dir + "/data/val-*.tok");

  ASSERT_TRUE(WriteFileAtomic(path, "[data]\npath = \"d\"\nsteps = 1\n").ok());
  ExpectError(LoadJobSpec(path).status(), path + ": data.steps: unknown key");
  EXPECT_FALSE(LoadJobSpec(dir + "/missing.toml").ok());
}

TEST(JobSpecBoundsTest, HostileValuesAreRefusedBeforeAnyArithmetic) {
  const std::string base = "[data]\npath = \"d.tok\"\n";
  struct Case {
    std::string toml, message;
  };
  const std::vector<Case> cases = {
      {"name = \"" + std::string(257, 'n') + "\"\n" + base, "name: must be at most 256 bytes"},
      {"name = \"a\\u001b[2Jb\"\n" + base, "name: must not contain control characters"},
      {base + "seq_len = 100000000000\n", "data.seq_len: must be in [2, 134217728]"},
      {base + "micro_batch = 1000000000000\n", "data.micro_batch: must be in [1, 4096]"},
      {base + "seq_len = 1048576\nmicro_batch = 4096\n[training]\ngrad_accum = 1048576\n",
       "tokens per step; at most 4294967296"},
      {base + "[parallel]\nworld = 100000\nsp = 1\n", "parallel.world: must be in [1, 65536]"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(c.toml);
    ASSERT_FALSE(spec.ok()) << c.toml.substr(0, 80);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(c.message), std::string::npos) << spec.status();
  }
}

// toml++ 3.3 has undefined behaviour on these (found by fuzz/job_spec_fuzzer.cc; the inputs are
// in fuzz/corpus/job_spec/crash_*): the parser refuses them before toml++ sees them.
TEST(JobSpecTest, NonAsciiOutsideStringsIsRefused) {
  // The fuzzer's input: U+FEBF inside a bare key.
  ExpectError(ParseError("na\xef\xba\xbf= \"x\" # c\n[data]\npath = \"d\"\n"),
              "job.toml:1:3: invalid TOML: a non-ASCII character outside a string or comment");
  ExpectError(ErrorWith("[training]\nsteps = 1 \xc2\xa7\n"),
              "job.toml:4:11: invalid TOML: a non-ASCII character outside a string or comment");
  ExpectError(ErrorWith("name = \"\"\"?\\\xc2\xa7\"\"\"\n"),
              "job.toml:3:13: invalid TOML: a non-ASCII character after a backslash (not an "
              "escape)");
  ExpectError(ErrorWith("name = \"\\\xc2\xa7\"\n"), "job.toml:3:10: invalid TOML: ");
  ExpectError(ErrorWith("name = \"\"\"?\\ \xef\xbb\xb5\"\"\"\n"),  // no newline after the blank
              "job.toml:3:14: invalid TOML: a non-ASCII character right after a line-ending "
              "backslash");
  // `"e = "` is a quoted key: what follows is not a string (crash_nonascii_after_quoted_key).
  ExpectError(ParseError("\"e = \"\xef\xbb\xbel"),
              "job.toml:1:7: invalid TOML: a non-ASCII character outside a string or comment");
  // A '#' inside a quoted key opens no comment (crash_nonascii_after_hash_in_quoted_key), nor
  // does one on a later line, which may still be inside a quoted multi-line key or an array.
  ExpectError(ParseError(" e={\"#m{\"={\"bm{\"\xc3\x84\"\n"),
              "job.toml:1:17: invalid TOML: a non-ASCII character outside a string or comment");
  ExpectError(ParseError("\"\"\"\n# \\ \xc2\xa7\"\"\"\n"),
              "job.toml:2:5: invalid TOML: a non-ASCII character outside a string or comment");
  ExpectError(ParseError("x = [\na=\"\xc2\xa7\"]\n"),
              "job.toml:2:4: invalid TOML: a non-ASCII character outside a string or comment");
  // A quote inside a malformed number opens no string (crash_nonascii_after_quote_in_number).
  ExpectError(ErrorWith("seq_len = 0x\"\xc2\xa7\n"),
              "job.toml:3:14: invalid TOML: a non-ASCII character outside a string or comment");
  ExpectError(ParseError("d= 04jso.\":::::\xc6\x9b"),  // crash_nonascii_after_quote_after_dot
              "job.toml:1:16: invalid TOML: a non-ASCII character outside a string or comment");
  ExpectError(ErrorWith("name = 0x=\"\xc2\xa7\"\n"),
              "job.toml:3:12: invalid TOML: a non-ASCII character outside a string or comment");
  ExpectError(ErrorWith("name = \"\"\"x\\\n  \n  \xc2\xa7\"\"\"\n"),
              "job.toml:5:3: invalid TOML: a non-ASCII character right after a line-ending "
              "backslash");
}

TEST(JobSpecTest, NonAsciiInsideStringsAndCommentsIsAccepted) {
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      "name = \"caf\xc3\xa9 \\\" \xc2\xa7\" # \xc2\xa7\n"
      "[data] # '\n"
      "path = '''\xc2\xa7'''\n"
      "[model]\n"
      "weights = \"\"\"w\\\n  \\u00a7\xc2\xa7\"\"\"\"\n",
      "job.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "caf\xc3\xa9 \" \xc2\xa7");
  EXPECT_EQ(s->data.path, "\xc2\xa7");
  EXPECT_EQ(s->model.weights, "w\xc2\xa7\xc2\xa7\"");
}

// toml++ asserted (aborting the process in a build without NDEBUG) on these, found by
// fuzz/job_spec_fuzzer.cc (fuzz/corpus/job_spec/crash_assert_table_header_comment.toml).
TEST(JobSpecTest, MalformedTableHeaderIsAnErrorNotAnAbort) {
  ExpectError(ParseError("[#"), "job.toml:1:2: invalid TOML: ");
  ExpectError(ParseError(std::string("[#ata \v\0\0\0\1\0\0\0\npath/\"\n", 22)),
              "job.toml:1:2: invalid TOML: ");
  ExpectError(ParseError("[[ #x\n"), "job.toml:1:");
}

// min_lr is a ratio of lr unless given absolute: the usual fine-tune lr = 1e-5 was refused
// against the absolute default 3e-5 ("must be <= training.lr").
TEST(JobSpecTest, MinLrIsARatioUnlessGivenAndSchedulesParse) {
  auto fine_tune = ParseJobSpec("[data]\npath = \"d.tok\"\n[training]\nlr = 1e-5\n", "job.toml");
  ASSERT_TRUE(fine_tune.ok()) << fine_tune.status();
  EXPECT_DOUBLE_EQ(fine_tune->training.min_lr, 1e-6);
  EXPECT_EQ(fine_tune->training.schedule, "cosine");
  auto ratio = ParseJobSpec("[data]\npath = \"d.tok\"\n[training]\nlr = 2e-4\nmin_lr_ratio = 0\n",
                            "job.toml");
  ASSERT_TRUE(ratio.ok()) << ratio.status();
  EXPECT_DOUBLE_EQ(ratio->training.min_lr, 0.0);
  auto absolute =
      ParseJobSpec("[data]\npath = \"d.tok\"\n[training]\nlr = 2e-4\nmin_lr = 5e-6\n", "job.toml");
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  EXPECT_DOUBLE_EQ(absolute->training.min_lr, 5e-6);
  auto wsd = ParseJobSpec(
      "[data]\npath = \"d.tok\"\n[training]\nschedule = \"wsd\"\ndecay_ratio = 0.1\n", "job.toml");
  ASSERT_TRUE(wsd.ok()) << wsd.status();
  EXPECT_EQ(wsd->training.schedule, "wsd");
  EXPECT_DOUBLE_EQ(wsd->training.decay_ratio, 0.1);
  // The written spec (what the workers get) says the same: min_lr absolute.
  auto back = ParseJobSpec(JobSpecToToml(*wsd), "resolved");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->training.schedule, "wsd");
  EXPECT_DOUBLE_EQ(back->training.min_lr, wsd->training.min_lr);
  EXPECT_DOUBLE_EQ(back->training.decay_ratio, 0.1);
}

TEST(RopeSpecTest, ParsesAndRoundTripsUnderModel) {
  absl::StatusOr<JobSpec> a = ParseJobSpec(kFullSpec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->model.rope.theta, 2e6);
  EXPECT_EQ(a->model.rope.scaling, "llama3");
  EXPECT_EQ(a->model.rope.factor, 16);
  EXPECT_EQ(a->model.rope.original_max_position_embeddings, 4096);
  const std::string text = JobSpecToToml(*a);
  EXPECT_NE(text.find("[model.rope]\ntheta = 2e+06\nscaling = \"llama3\"\n"), std::string::npos)
      << text;
  // Unset keys are not written; without any key the section is not either.
  EXPECT_EQ(text.find("beta_fast"), std::string::npos) << text;
  absl::StatusOr<JobSpec> plain = ParseJobSpec("[data]\npath = \"d.tok\"\n");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->model.rope.set());
  EXPECT_EQ(JobSpecToToml(*plain).find("[model.rope]"), std::string::npos);
  EXPECT_EQ(JobSpecToToml(*plain).find("[init]"), std::string::npos);
  // The dotted spelling and --set's path reach the same key.
  absl::StatusOr<JobSpec> dotted =
      ParseJobSpec("[data]\npath = \"d.tok\"\n[model]\nrope.theta = 40000\n");
  ASSERT_TRUE(dotted.ok()) << dotted.status();
  EXPECT_EQ(dotted->model.rope.theta, 40000);
}

TEST(RopeSpecTest, BadValuesNameTheirKey) {
  ExpectError(ErrorWith("[model.rope]\ntheta = -1\n"), "job.toml: model.rope.theta: must be > 0");
  ExpectError(ErrorWith("[model.rope]\ntheta = 0\n"), "job.toml: model.rope.theta: must be > 0");
  ExpectError(ErrorWith("[model.rope]\nscaling = \"dynamic\"\n"),
              "job.toml: model.rope.scaling: must be \"none\", \"linear\", \"llama3\" or "
              "\"yarn\"");
  ExpectError(ErrorWith("[model.rope]\nfactor = 4\n"),
              "job.toml: model.rope.factor: needs model.rope.scaling");
  ExpectError(ErrorWith("[model.rope]\nscaling = \"yarn\"\n"),
              "job.toml: model.rope.factor: required with scaling \"yarn\"");
  ExpectError(ErrorWith("[model.rope]\nscaling = \"llama3\"\nfactor = 8\nbeta_fast = 16\n"),
              "job.toml: model.rope.beta_fast: not a parameter of scaling \"llama3\"");
  ExpectError(ErrorWith("[model.rope]\nscaling = \"none\"\nfactor = 8\n"),
              "job.toml: model.rope.factor: not a parameter of scaling \"none\"");
  ExpectError(ErrorWith("[model.rope]\nscaling = \"linear\"\nfactor = -2\n"),
              "job.toml: model.rope.factor: must be > 0");
  ExpectError(ErrorWith("[model.rope]\nscaling = \"llama3\"\nfactor = 8\nhigh_freq_factor = 0.5\n"),
              "job.toml: model.rope.high_freq_factor: must exceed low_freq_factor (1.0), got 0.5");
  ExpectError(ErrorWith("[model.rope]\nscaling = \"yarn\"\nfactor = 4\n"
                        "original_max_position_embeddings = 0\n"),
              "job.toml: model.rope.original_max_position_embeddings: must be in [1, ");
  ExpectError(ErrorWith("[model.rope]\nthet = 1e6\n"),
              "job.toml: model.rope.thet: unknown key (line 4); did you mean model.rope.theta?");
  ExpectError(ErrorWith("[model.rop]\ntheta = 1e6\n"),
              "job.toml: model.rop: unknown key (line 3); did you mean model.rope?");
}

TEST(RopeSpecTest, OverridesTheModelsConfig) {
  JobSpec s;
  s.model.preset = "llama-3.2-1b";
  absl::StatusOr<LlamaConfig> base = ResolveModelConfig(s);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_EQ(base->rope.type, RopeType::kLlama3);

  // Theta alone keeps the model's scaling.
  s.model.rope.theta = 2e6;
  absl::StatusOr<LlamaConfig> theta = ResolveModelConfig(s);
  ASSERT_TRUE(theta.ok()) << theta.status();
  EXPECT_EQ(theta->rope_theta, 2e6);
  EXPECT_EQ(theta->rope.theta, 2e6);
  EXPECT_EQ(theta->rope.type, RopeType::kLlama3);
  EXPECT_EQ(theta->rope.factor, base->rope.factor);
  EXPECT_FALSE(SameModelRope(*base, *theta));

  // A scaling replaces type and parameters; the original context stays the model's.
  s.model.rope.scaling = "yarn";
  s.model.rope.factor = 4;
  absl::StatusOr<LlamaConfig> yarn = ResolveModelConfig(s);
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_EQ(yarn->rope.type, RopeType::kYarn);
  EXPECT_EQ(yarn->rope.factor, 4);
  EXPECT_EQ(yarn->rope.beta_fast, 32);
  EXPECT_EQ(yarn->rope.beta_slow, 1);
  EXPECT_NEAR(yarn->rope.attention_factor, 0.1 * std::log(4.0) + 1, 1e-12);
  EXPECT_EQ(yarn->rope.original_max_position, 8192);
  EXPECT_EQ(yarn->rope.head_dim, base->rope.head_dim);
  EXPECT_NE(DescribeModelRope(*yarn).find("rope_theta 2e+06, yarn factor 4"), std::string::npos)
      << DescribeModelRope(*yarn);

  s.model.rope = {};
  s.model.rope.scaling = "none";
  absl::StatusOr<LlamaConfig> none = ResolveModelConfig(s);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->rope.type, RopeType::kDefault);
  EXPECT_EQ(none->rope_theta, base->rope_theta);

  // A scaling on a model without one: the original context is its max_position_embeddings.
  JobSpec q;
  q.model.preset = "qwen3-0.6b";
  q.model.rope.scaling = "yarn";
  q.model.rope.factor = 4;
  absl::StatusOr<LlamaConfig> qwen = ResolveModelConfig(q);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->rope.original_max_position, qwen->max_position_embeddings);
  EXPECT_TRUE(CheckRopeFamily(q.model.rope, *qwen).ok());
  // llama3 is Llama's own: refused for the other families.
  q.model.rope.scaling = "llama3";
  absl::StatusOr<LlamaConfig> q3 = ResolveModelConfig(q);
  ASSERT_TRUE(q3.ok());
  absl::Status family = ValidateJob(q, *q3);
  ASSERT_FALSE(family.ok());
  EXPECT_EQ(std::string(family.message()).rfind("model.rope.scaling: \"llama3\" is Llama 3's", 0),
            0u)
      << family;
}

TEST(RopeSpecTest, SeqLenPastTheModelsContextWarnsNamingTheRopeKeys) {
  JobSpec s;
  s.model.preset = "qwen3-0.6b";
  absl::StatusOr<LlamaConfig> cfg = ResolveModelConfig(s);
  ASSERT_TRUE(cfg.ok());
  s.data.seq_len = cfg->max_position_embeddings;
  EXPECT_TRUE(JobWarnings(s, *cfg).empty());
  s.data.seq_len = 2 * cfg->max_position_embeddings;
  std::vector<std::string> w = JobWarnings(s, *cfg);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("exceeds the model's max_position_embeddings"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("[model.rope] theta"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("original_max_position_embeddings"), std::string::npos) << w[0];
  s.model.rope.theta = 4e6;  // the job extends it
  EXPECT_TRUE(JobWarnings(s, *cfg).empty());
}

TEST(InitSpecTest, FromIsAPathOrAJob) {
  absl::StatusOr<JobSpec> a = ParseJobSpec(
      "[data]\npath = \"d.tok\"\n[checkpoint]\ndir = \"ck2\"\n[init]\nfrom = \"ck1\"\n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->init.from, "ck1");
  const std::string text = JobSpecToToml(*a);
  EXPECT_NE(text.find("[init]\nfrom = \"ck1\"\n"), std::string::npos) << text;
  absl::StatusOr<JobSpec> b = ParseJobSpec(text);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->init.from, "ck1");

  EXPECT_EQ(InitFromJob("job:job-12"), "job-12");
  EXPECT_EQ(InitFromJob("job:7"), "job-7");
  EXPECT_EQ(InitFromJob("ck1"), "");
  EXPECT_EQ(InitFromJob("job:"), "");
  EXPECT_EQ(InitFromJob("job:a/b"), "");

  ExpectError(ErrorWith("[init]\nfrom = \"job:../x\"\n"),
              "job.toml: init.from: \"job:../x\" names no job");
  ExpectError(ErrorWith("[model]\nweights = \"/m\"\n[init]\nfrom = \"/ck\"\n"),
              "job.toml: init.from: set either init.from (a new phase's start) or model.weights");
  ExpectError(ErrorWith("[init]\nfrm = \"/ck\"\n"),
              "job.toml: init.frm: unknown key (line 4); did you mean init.from?");
}

TEST(InitSpecTest, LoadResolvesAPathButNotAJob) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  const std::string dir = std::string(tmp) + "/init_spec";
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(
      WriteFileAtomic(dir + "/a.toml", "[data]\npath = \"d.tok\"\n[init]\nfrom = \"phase1/ck\"\n")
          .ok());
  ASSERT_TRUE(
      WriteFileAtomic(dir + "/b.toml", "[data]\npath = \"d.tok\"\n[init]\nfrom = \"job:3\"\n")
          .ok());
  absl::StatusOr<JobSpec> a = LoadJobSpec(dir + "/a.toml");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->init.from, dir + "/phase1/ck");
  absl::StatusOr<JobSpec> b = LoadJobSpec(dir + "/b.toml");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->init.from, "job:3");
}

TEST(LoraSpecTest, ParsesWritesBackAndMakesTheModelsAdapters) {
  absl::StatusOr<JobSpec> a = ParseJobSpec(
      "[data]\npath = \"d.tok\"\n[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\", "
      "\"down_proj\"]\ninit = \"adapter\"\n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->lora.rank, 4);
  EXPECT_EQ(a->lora.alpha, 8.0);
  EXPECT_EQ(a->lora.targets, (std::vector<std::string>{"q_proj", "down_proj"}));
  const std::string text = JobSpecToToml(*a);
  EXPECT_NE(text.find("[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\", \"down_proj\"]\n"
                      "init = \"adapter\"\n"),
            std::string::npos)
      << text;
  absl::StatusOr<JobSpec> b = ParseJobSpec(text);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->lora.targets, a->lora.targets);
  absl::StatusOr<LlamaConfig> cfg = ResolveModelConfig(*b);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->lora.rank, 4);
  EXPECT_FLOAT_EQ(cfg->lora.scale(), 2.f);
  EXPECT_TRUE(cfg->lora.targets[kLoraQ]);
  EXPECT_TRUE(cfg->lora.targets[kLoraDown]);
  EXPECT_FALSE(cfg->lora.targets[kLoraV]);
  // Without [lora] the section is not written and the model has no adapters.
  absl::StatusOr<JobSpec> plain = ParseJobSpec("[data]\npath = \"d.tok\"\n");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(JobSpecToToml(*plain).find("[lora]"), std::string::npos);
}

TEST(LoraSpecTest, BadSectionsAreRefusedByKey) {
  ExpectError(ErrorWith("[lora]\nalpha = 8.0\n"), "job.toml: lora.alpha: needs lora.rank");
  ExpectError(ErrorWith("[lora]\nrank = 4\ntargets = [\"q_proj\"]\n"),
              "job.toml: lora.alpha: required with lora.rank");
  ExpectError(ErrorWith("[lora]\nrank = 4\nalpha = 8.0\n"),
              "job.toml: lora.targets: required with lora.rank");
  ExpectError(ErrorWith("[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q\"]\n"),
              "job.toml: lora.targets: must hold only \"q_proj\"");
  ExpectError(ErrorWith("[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\", \"q_proj\"]\n"),
              "job.toml: lora.targets: \"q_proj\" is given twice");
  ExpectError(ErrorWith("[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\"]\ndropout = 0.1\n"),
              "job.toml: lora.dropout: only 0 is implemented, got 0.1");
  ExpectError(ErrorWith("[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\"]\n"
                        "merge_on_export = true\n"),
              "job.toml: lora.merge_on_export: needs checkpoint.export");
  ExpectError(ErrorWith("[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"q_proj\"]\n"
                        "merge_on_export = true\n[checkpoint]\ndir = \"c\"\nexport = \"bf16\"\n"),
              "job.toml: lora.merge_on_export: needs model.weights or init.from");
}

}  // namespace
}  // namespace ithaca
