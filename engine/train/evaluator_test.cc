// The [eval] section end to end on the CPU backend: the eval loss is the forward loss the
// training step computes on the same windows; evaluating changes nothing of training (losses and
// weights bit for bit); an evaluation-only job evaluates the model it loads (the seeded weights
// or a checkpoint); and bad eval data is an error naming eval.path and the file. Two ranks:
// evaluator_distributed_test.
#include "engine/train/evaluator.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/plan/resolve.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string TmpDir(const std::string& name) {
  std::string d = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

std::vector<uint32_t> CorpusTokens() {
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  return ByteTokenize(text.ok() ? *text : "");
}

std::string WriteCorpus(const std::string& dir) {
  const std::string path = dir + "/corpus.tok";
  const std::vector<uint32_t> tokens = CorpusTokens();
  EXPECT_TRUE(WriteTokenFileV2(path, tokens, ByteTokenMeta(tokens)).ok());
  return path;
}

// Trains on the corpus in file order and evaluates on the same corpus, so step 1's loss and an
// evaluation of the initial weights see the same windows.
JobSpec SmallSpec(const std::string& dir) {
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = WriteCorpus(dir);
  spec.data.seq_len = 64;
  spec.data.shuffle = false;
  spec.training.steps = 4;
  spec.training.lr = 3e-3;
  spec.training.min_lr = 3e-4;
  spec.training.warmup_steps = 1;
  spec.training.grad_accum = 2;
  spec.memory.tile_tokens = 16;
  spec.eval.path = spec.data.path;
  spec.eval.batches = 2;
  return spec;
}

// What the workers get: the spec resolved (and validated) on a roomy node.
absl::StatusOr<JobSpec> Resolved(const JobSpec& spec) {
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  node.ranks_on_host = static_cast<int>(spec.parallel.world);
  ASSIGN_OR_RETURN(ResolvedJob job, ResolveJob(spec, node));
  // Through the TOML the daemon sends, so the [eval] section must survive it.
  return ParseJobSpec(job.toml, "resolved.toml");
}

struct Run {
  std::vector<double> step_losses;
  std::vector<EvalReport> evals;
  HostWeights master;
};

absl::StatusOr<Run> Train(const JobSpec& spec) {
  ASSIGN_OR_RETURN(JobSpec resolved, Resolved(spec));
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(auto t, Trainer::Create(resolved, &ops, &alloc));
  Run out;
  RETURN_IF_ERROR(t->Run([&](const StepReport& r) { out.step_losses.push_back(r.loss); }, 0,
                         [&](const EvalReport& r) { out.evals.push_back(r); }));
  ASSIGN_OR_RETURN(out.master, t->GatherMasterWeights());
  return out;
}

TEST(EvalLineTest, HasTheStableFields) {
  EvalReport r;
  r.step = 20;
  r.loss = 3.1234;
  r.tokens = 65536;
  r.batches = 8;
  r.seconds = 1.2;
  EXPECT_EQ(FormatEvalLine(r),
            "eval step 20: loss 3.1234 (ppl 22.7) over 65536 tokens, 8 batches, "
            "1.20 s");
}

// The evaluation's forward-only loss over eval.batches windows is the loss the training step's
// forward computes over the same windows (grad_accum = eval.batches, data in file order).
TEST(EvaluatorTest, EqualsTheTrainingStepsForwardLoss) {
  const std::string dir = TmpDir("equals");
  JobSpec spec = SmallSpec(dir);
  spec.training.steps = 1;
  auto resolved = Resolved(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(*resolved, &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  auto before = (*t)->Evaluate();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->step, 0);
  EXPECT_EQ(before->tokens, 2 * 64);
  EXPECT_EQ(before->batches, 2);
  double step_loss = 0;
  std::vector<EvalReport> evals;
  ASSERT_TRUE((*t)->Run([&](const StepReport& r) { step_loss = r.loss; }, 0,
                        [&](const EvalReport& r) { evals.push_back(r); })
                  .ok());
  EXPECT_NEAR(before->loss, step_loss, 1e-5 * step_loss);
  EXPECT_NEAR(before->loss, std::log(258.0), 0.3) << "a random init is near uniform";
  // After the last step, once, on the trained weights: lower.
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].step, 1);
  EXPECT_LT(evals[0].loss, before->loss);
  // The same windows every time: evaluating twice gives the same number.
  auto again = (*t)->Evaluate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->loss, evals[0].loss);
}

// Evaluating every step reads no training data, takes no gradient and touches no optimizer
// state: the training run is the same, bit for bit.
TEST(EvaluatorTest, EvaluatingChangesNothingOfTraining) {
  const std::string dir = TmpDir("unchanged");
  JobSpec with = SmallSpec(dir);
  with.eval.every = 1;
  JobSpec without = with;
  without.eval = JobSpec::Eval();
  auto a = Train(with);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Train(without);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->step_losses.size(), 4u);
  EXPECT_EQ(a->step_losses, b->step_losses);
  ASSERT_EQ(a->master.size(), b->master.size());
  for (size_t u = 0; u < a->master.size(); ++u) {
    ASSERT_EQ(a->master[u], b->master[u]) << "unit " << u;
  }
  ASSERT_EQ(a->evals.size(), 4u) << "every step, the last one once";
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a->evals[i].step, i + 1);
  EXPECT_TRUE(b->evals.empty());

  // eval.every = 3 of 4 steps: after step 3, and after the last.
  with.eval.every = 3;
  auto c = Train(with);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->evals.size(), 2u);
  EXPECT_EQ(c->evals[0].step, 3);
  EXPECT_EQ(c->evals[1].step, 4);
  EXPECT_EQ(c->evals[1].loss, a->evals[3].loss);
}

// training.steps = 0: the model is loaded (here from the checkpoint a training job left), then
// evaluated once; learning rate 0 is fine. Its loss is the training job's final evaluation.
TEST(EvaluatorTest, AnEvaluationOnlyJobEvaluatesTheModelItLoads) {
  const std::string dir = TmpDir("eval_only");
  JobSpec train = SmallSpec(dir);
  train.checkpoint.dir = dir + "/ck";
  auto trained = Train(train);
  ASSERT_TRUE(trained.ok()) << trained.status();
  ASSERT_EQ(trained->evals.size(), 1u);

  JobSpec eval_only = train;
  eval_only.data.path = "";  // no training data needed
  eval_only.training.steps = 0;
  eval_only.training.lr = 0;
  eval_only.training.min_lr = 0;
  auto evaluated = Train(eval_only);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  EXPECT_TRUE(evaluated->step_losses.empty());
  ASSERT_EQ(evaluated->evals.size(), 1u);
  EXPECT_EQ(evaluated->evals[0].step, 4) << "the checkpoint's step";
  EXPECT_EQ(evaluated->evals[0].loss, trained->evals[0].loss);
  EXPECT_EQ(evaluated->master, trained->master) << "an evaluation changes no weight";

  // Without a checkpoint: the spec's own weights (here the seeded random init), at step 0.
  eval_only.checkpoint.dir = "";
  auto fresh = Train(eval_only);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_EQ(fresh->evals.size(), 1u);
  EXPECT_EQ(fresh->evals[0].step, 0);
  EXPECT_NEAR(fresh->evals[0].loss, std::log(258.0), 0.3);
}

// Bad eval data: missing, a glob that matches nothing, corrupt, another vocabulary than the
// model's, another tokenizer than the model's or the training data's, too short for the
// evaluation. Each error starts with eval.path and names the file.
TEST(EvaluatorTest, BadEvalDataNamesEvalPathAndTheFile) {
  const std::string dir = TmpDir("bad");
  JobSpec spec = SmallSpec(dir);
  CpuOps ops;
  HostAllocator alloc;
  auto error_with = [&](const JobSpec& s) -> absl::Status {
    auto resolved = Resolved(s);
    if (!resolved.ok()) return resolved.status();
    return Trainer::Create(*resolved, &ops, &alloc).status();
  };
  auto expect = [&](const std::string& eval_path, const std::string& part) {
    SCOPED_TRACE(eval_path);
    JobSpec s = spec;
    s.eval.path = eval_path;
    absl::Status st = error_with(s);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(std::string(st.message()).rfind("eval.path: ", 0), 0u) << st;
    EXPECT_NE(st.message().find(part), std::string::npos) << st;
  };
  expect(dir + "/missing.tok", dir + "/missing.tok");
  expect(dir + "/val-*.tok", dir + "/val-*.tok: the pattern matches no file");

  ASSERT_TRUE(WriteFileAtomic(dir + "/corrupt.tok", "ITHACATK but not a token file").ok());
  expect(dir + "/corrupt.tok", dir + "/corrupt.tok");

  const std::vector<uint32_t> tokens = CorpusTokens();
  ASSERT_TRUE(WriteTokenFile(dir + "/big_vocab.tok", tokens, 1000).ok());
  expect(dir + "/big_vocab.tok", dir +
                                     "/big_vocab.tok: the file's vocab_size 1000 exceeds the "
                                     "model's vocab_size 258");

  TokenFileMeta other = ByteTokenMeta(tokens);
  other.fingerprint[0] = 7;
  ASSERT_TRUE(WriteTokenFileV2(dir + "/other_tokenizer.tok", tokens, other).ok());
  expect(dir + "/other_tokenizer.tok", dir + "/other_tokenizer.tok: made with tokenizer 07");
  expect(dir + "/other_tokenizer.tok", "data.path's " + spec.data.path);

  // Against the model's tokenizer.json: the same check as data.path's, for an evaluation-only
  // job too (it has no training data to compare with).
  const std::string model = TmpDir("bad/model");
  auto cfg = PresetConfig("tiny");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(WriteFileAtomic(model + "/config.json", ConfigToJson(*cfg)).ok());
  auto tokenizer = ReadFileToString("engine/data/testdata/bpe/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  ASSERT_TRUE(WriteFileAtomic(model + "/tokenizer.json", *tokenizer).ok());
  JobSpec eval_only = spec;
  eval_only.model.config = model + "/config.json";
  eval_only.data.path = "";
  eval_only.training.steps = 0;
  eval_only.eval.path = dir + "/other_tokenizer.tok";
  absl::Status st = error_with(eval_only);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("eval.path: " + dir +
                              "/other_tokenizer.tok: tokenized with tokenizer sha256 07"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("the model's tokenizer " + model + "/tokenizer.json"),
            std::string::npos)
      << st;

  // 3 windows of 65 tokens; 2 batches x micro_batch 2 need 4.
  std::vector<uint32_t> few(tokens.begin(), tokens.begin() + 3 * 64 + 1);
  ASSERT_TRUE(WriteTokenFileV2(dir + "/few.tok", few, ByteTokenMeta(few)).ok());
  JobSpec short_eval = spec;
  short_eval.data.micro_batch = 2;
  short_eval.training.grad_accum = 1;
  short_eval.eval.path = dir + "/few.tok";
  st = error_with(short_eval);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("eval.path: " + dir +
                              "/few.tok holds 3 windows of data.seq_len + "
                              "1 = 65 tokens; an evaluation reads 4"),
            std::string::npos)
      << st;
  short_eval.eval.batches = 1;
  EXPECT_TRUE(error_with(short_eval).ok());
}

// A label's position: its index, or with documents its distance from its document's start.
TEST(PositionBucketsTest, PositionsAndBuckets) {
  EXPECT_EQ(LabelPositions(5, DocumentMask{}), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  DocumentMask docs;
  docs.starts = {0, 3, 4};
  EXPECT_EQ(LabelPositions(7, docs), (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 2}));
  const std::vector<PositionLoss> b = PositionBuckets({16, 40}, 64);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].begin, 0);
  EXPECT_EQ(b[0].end, 16);
  EXPECT_EQ(b[1].begin, 16);
  EXPECT_EQ(b[1].end, 40);
  EXPECT_EQ(b[2].begin, 40);
  EXPECT_EQ(b[2].end, 64);
  EvalReport r;
  r.step = 20;
  r.positions = {{0, 1024, 3.21, 10}, {1024, 4096, 2.98, 10}};
  EXPECT_EQ(FormatPositionLine(r),
            "eval step 20 by position: [0, 1024) 3.2100, [1024, 4096) 2.9800");
}

// eval.position_buckets splits the held-out loss by position. Computed a second way, from the
// model being causal: the loss of a window's first n labels is the loss of the window cut to n
// tokens, so a bucket [a, b) is the cut at b less the cut at a, with no label masked.
TEST(EvaluatorTest, LossByPositionIsTheLossOfTheCutWindows) {
  const std::string dir = TmpDir("positions");
  JobSpec spec = SmallSpec(dir);
  spec.eval.position_buckets = {16, 40};
  auto resolved = Resolved(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(*resolved, &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<EvalReport> evals;
  ASSERT_TRUE((*t)->Run(nullptr, 0, [&](const EvalReport& r) { evals.push_back(r); }).ok());
  ASSERT_EQ(evals.size(), 1u);
  const EvalReport& r = evals[0];
  ASSERT_EQ(r.positions.size(), 3u);

  // The windows in file order: window w's inputs are tokens [64 w, 64 w + 64), its labels the
  // next tokens; the loss sum of its first n labels, from the window cut to n tokens.
  const std::vector<uint32_t> corpus = CorpusTokens();
  const int64_t S = 64;
  LlamaModel* model = (*t)->model();
  auto prefix_loss = [&](int64_t w, int64_t n) -> double {
    std::vector<int32_t> in(n), lab(n);
    for (int64_t i = 0; i < n; ++i) {
      in[i] = static_cast<int32_t>(corpus[w * S + i]);
      lab[i] = static_cast<int32_t>(corpus[w * S + i + 1]);
    }
    auto sample = model->UploadSample(in.data(), lab.data(), n);
    EXPECT_TRUE(sample.ok()) << sample.status();
    auto sum = Buffer::Make(&alloc, DType::kF32, {1}, Tier::kActivations);
    EXPECT_TRUE(sum.ok());
    EXPECT_TRUE(model->Forward(*sample, sum->tensor()).ok());
    float v = 0;
    ops.Download(sum->tensor(), &v, DType::kF32);
    return v;
  };
  const int64_t windows = spec.eval.batches;  // one window a batch (micro_batch 1, one rank)
  const int64_t cuts[] = {0, 16, 40, 64};
  int64_t tokens = 0;
  double all = 0;
  for (int k = 0; k < 3; ++k) {
    double sum = 0;
    for (int64_t w = 0; w < windows; ++w) {
      sum += prefix_loss(w, cuts[k + 1]) - (cuts[k] > 0 ? prefix_loss(w, cuts[k]) : 0.0);
    }
    const int64_t n = windows * (cuts[k + 1] - cuts[k]);
    EXPECT_EQ(r.positions[k].begin, cuts[k]);
    EXPECT_EQ(r.positions[k].end, cuts[k + 1]);
    EXPECT_EQ(r.positions[k].tokens, n);
    EXPECT_NEAR(r.positions[k].loss, sum / n, 1e-4 * sum / n) << "bucket " << k;
    tokens += r.positions[k].tokens;
    all += r.positions[k].loss * r.positions[k].tokens;
  }
  // The buckets make up the whole: the same tokens and the same mean.
  EXPECT_EQ(tokens, r.tokens);
  EXPECT_NEAR(all / tokens, r.loss, 1e-6 * r.loss);
  // Without the key the report has no buckets, and the same loss.
  spec.eval.position_buckets.clear();
  auto plain = Resolved(spec);
  ASSERT_TRUE(plain.ok());
  auto u = Trainer::Create(*plain, &ops, &alloc);
  ASSERT_TRUE(u.ok());
  std::vector<EvalReport> plain_evals;
  ASSERT_TRUE((*u)->Run(nullptr, 0, [&](const EvalReport& e) { plain_evals.push_back(e); }).ok());
  ASSERT_EQ(plain_evals.size(), 1u);
  EXPECT_TRUE(plain_evals[0].positions.empty());
  EXPECT_NEAR(plain_evals[0].loss, r.loss, 1e-5 * r.loss);
}

}  // namespace
}  // namespace ithaca
