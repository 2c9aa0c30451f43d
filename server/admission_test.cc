#include "server/admission.h"

#include <limits.h>

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/core/path_policy.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"
#include "server/node.h"
#include "server/test_workers.h"

namespace ithaca {
namespace {

// A spec whose data file exists and is a real token file (admission opens it as the workers do).
std::string Dir() {
  const char* t = std::getenv("TEST_TMPDIR");
  static const std::string dir = [&] {
    std::string d = t ? t : "/tmp";
    WriteCorpus(d + "/corpus.tok");
    return d;
  }();
  return dir;
}

std::string Spec(const std::string& extra = "", const std::string& parallel = "") {
  return "name = \"t\"\nbackend = \"cpu\"\n" + extra + "[model]\npreset = \"tiny\"\n" +
         "[data]\npath = \"corpus.tok\"\nseq_len = 64\n[training]\nsteps = 3\n" + parallel;
}

Node CpuNode(int slots, int64_t host_bytes) {
  Node n;
  n.host_memory_bytes = host_bytes;
  for (int i = 0; i < slots; ++i) n.devices.push_back({i, "", "cpu slot", host_bytes});
  return n;
}

Node GpuNode(int gpus, int64_t gpu_bytes, int64_t host_bytes) {
  Node n;
  n.gpu = true;
  n.host_memory_bytes = host_bytes;
  for (int i = 0; i < gpus; ++i) n.devices.push_back({i, "GPU-x", "NVIDIA H200", gpu_bytes});
  return n;
}

const Node& Roomy() {
  static const Node node = CpuNode(8, int64_t{16} << 30);
  return node;
}

TEST(AdmissionTest, AcceptsAGoodSpecAndResolvesPathsAgainstBaseDir) {
  auto a = ParseSubmission(Spec(), "job.toml", Dir(), Roomy());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.data.path, Dir() + "/corpus.tok");
  EXPECT_EQ(a->summary.model(), "tiny");
  EXPECT_EQ(a->summary.parameters(), a->config.NumParameters());
  EXPECT_GT(a->summary.parameters(), 0);
  // The canonical TOML parses back to the same spec, resolved: nothing is left "auto".
  auto back = ParseJobSpec(a->toml);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data.path, a->spec.data.path);
  EXPECT_TRUE(CheckResolved(*back).ok()) << CheckResolved(*back);
  EXPECT_EQ(a->toml.find("auto"), std::string::npos) << a->toml;
  EXPECT_EQ(back->model.dtype, "f32");
  EXPECT_TRUE(CheckFits(*a, Roomy()).ok());
}

// A resubmission whose checkpoint.dir holds a finished run is refused at admission (no slot
// spent, the same words as the worker's check); raising training.steps or an evaluation-only job
// is admitted.
TEST(AdmissionTest, AResubmittedFinishedRunIsRefused) {
  const std::string ckpt = Dir() + "/finished-ckpt";
  const std::string step = ckpt + "/step-00000003";
  mkdir(ckpt.c_str(), 0755);
  mkdir(step.c_str(), 0755);
  std::ofstream(step + "/state.json") << R"({"step": 3, "data_position": 12, "run_id": "x"})";
  std::ofstream(step + "/manifest.json")
      << R"({"format": "ithaca-checkpoint-manifest-1", "files": []})";
  const std::string with_ckpt = "[checkpoint]\ndir = \"finished-ckpt\"\nresume = true\n";
  auto a = ParseSubmission(Spec("", with_ckpt), "job.toml", Dir(), Roomy());
  ASSERT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_EQ(a.status().message(),
            "job.toml: checkpoint.dir " + ckpt + " holds a finished run: " + step +
                " is at step 3 of training.steps = 3, so nothing would train. To continue it, "
                "raise training.steps above 3 (the learning-rate schedule continues from where "
                "it ended); to start over, use another checkpoint.dir");
  // A plan is a memory question: answered, with a warning that a submission would be refused
  // (issue 54 F6).
  auto plan = ParseSubmission(Spec("", with_ckpt), "job.toml", Dir(), Roomy(), "", {}, nullptr,
                              nullptr, {}, /*plan=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->plan.fits);
  ASSERT_FALSE(plan->warnings.empty());
  EXPECT_EQ(plan->warnings[0], "`ithaca submit` would refuse this spec: checkpoint.dir " + ckpt +
                                   " holds a finished run: " + step +
                                   " is at step 3 of training.steps = 3, so nothing would train. "
                                   "To continue it, raise training.steps above 3 (the "
                                   "learning-rate schedule continues from where it ended); to "
                                   "start over, use another checkpoint.dir");
  std::string longer = Spec("", with_ckpt);
  longer.replace(longer.find("steps = 3"), 9, "steps = 6");
  EXPECT_TRUE(ParseSubmission(longer, "job.toml", Dir(), Roomy()).ok());
  // Not resuming: the run starts over (training writes new steps), nothing to refuse.
  std::string fresh = Spec("", with_ckpt);
  fresh.replace(fresh.find("resume = true"), 13, "resume = false");
  EXPECT_TRUE(ParseSubmission(fresh, "job.toml", Dir(), Roomy()).ok());
}

TEST(AdmissionTest, DataPathMayBeAGlob) {
  std::string toml = Spec();
  toml.replace(toml.find("\"corpus.tok\""), 12, "\"corp*.tok\"");
  auto a = ParseSubmission(toml, "job.toml", Dir(), Roomy());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.data.path, Dir() + "/corp*.tok");
  toml.replace(toml.find("\"corp*.tok\""), 11, "\"none-*.tok\"");
  a = ParseSubmission(toml, "job.toml", Dir(), Roomy());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(
      a.status().message().find("data.path: " + Dir() + "/none-*.tok: the pattern matches no file"),
      std::string::npos)
      << a.status();
}

TEST(AdmissionTest, RelativePathsResolveOnTheDaemonsHost) {
  // The client's directory exists here (the CLI beside the daemon): paths resolve against it.
  const std::string state = Dir() + "/state";
  mkdir(state.c_str(), 0755);
  WriteCorpus(state + "/in-state.tok");
  Node node = Roomy();
  node.hostname = "gpu-node-7";
  auto a = ParseSubmission(Spec(), "job.toml", Dir(), node, state);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.data.path, Dir() + "/corpus.tok");
  // It does not (the daemon in a pod, the client on a laptop): against the state directory.
  std::string toml = Spec();
  toml.replace(toml.find("\"corpus.tok\""), 12, "\"in-state.tok\"");
  a = ParseSubmission(toml, "job.toml", "/home/me/runs", node, state);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.data.path, state + "/in-state.tok");
  // A missing file says which host looked where, and what the client's directory was.
  a = ParseSubmission(Spec(), "job.toml", "/home/me/runs", node, state);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.status().message(),
            "job.toml: data.path: " + state +
                "/corpus.tok: no such file or directory (looked for on the daemon's host (ithacad "
                "on gpu-node-7), relative to its state directory " +
                state +
                ": the client's directory /home/me/runs does not exist there; give a path on the "
                "daemon's host)");
  toml = Spec();
  toml.replace(toml.find("\"corpus.tok\""), 12, "\"missing.tok\"");
  a = ParseSubmission(toml, "job.toml", Dir(), node, state);
  EXPECT_EQ(a.status().message(), "job.toml: data.path: " + Dir() +
                                      "/missing.tok: no such file or directory (looked for on the "
                                      "daemon's host (ithacad on gpu-node-7), relative to the "
                                      "client's directory " +
                                      Dir() + ")");
  toml = Spec();
  toml.replace(toml.find("\"corpus.tok\""), 12, "\"/nowhere/x.tok\"");
  a = ParseSubmission(toml, "job.toml", Dir(), node, state);
  EXPECT_EQ(a.status().message(),
            "job.toml: data.path: /nowhere/x.tok: no such file or directory (looked for on the "
            "daemon's host (ithacad on gpu-node-7))");
}

TEST(AdmissionTest, AFifoAsDataIsRefusedAtSubmit) {
  const std::string fifo = Dir() + "/fifo.tok";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string toml = Spec();
  toml.replace(toml.find("\"corpus.tok\""), 12, "\"fifo.tok\"");
  auto a = ParseSubmission(toml, "job.toml", Dir(), Roomy());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("data.path: " + fifo + ": not a regular file (a FIFO)"),
            std::string::npos)
      << a.status();
}

// eval.path gets data.path's checks at submit: resolved against the spec, globs that match,
// regular files; each error names eval.path and the file.
TEST(AdmissionTest, EvalPathIsCheckedLikeDataPath) {
  auto a = ParseSubmission(Spec("", "[eval]\npath = \"corp*.tok\"\nevery = 2\n"), "job.toml", Dir(),
                           Roomy());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.eval.path, Dir() + "/corp*.tok");
  EXPECT_EQ(a->spec.eval.every, 2);
  auto back = ParseJobSpec(a->toml);  // what the workers get keeps the section
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->eval.path, Dir() + "/corp*.tok");

  const std::string fifo = Dir() + "/eval-fifo.tok";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    std::string path, message;
  } cases[] = {
      {"missing.tok", "eval.path: " + Dir() + "/missing.tok: no such file or directory"},
      {"none-*.tok", "eval.path: " + Dir() + "/none-*.tok: the pattern matches no file"},
      {"eval-fifo.tok", "eval.path: " + fifo + ": not a regular file (a FIFO)"},
  };
  for (const auto& c : cases) {
    a = ParseSubmission(Spec("", "[eval]\npath = \"" + c.path + "\"\n"), "job.toml", Dir(),
                        Roomy());
    ASSERT_FALSE(a.ok()) << c.path;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
    EXPECT_NE(a.status().message().find(c.message), std::string::npos) << a.status();
  }
}

TEST(AdmissionTest, AnEvaluationOnlyJobNeedsNoTrainingData) {
  const std::string toml =
      "name = \"e\"\n[model]\npreset = \"tiny\"\n[data]\nseq_len = 64\n"
      "[training]\nsteps = 0\nlr = 0\n[eval]\npath = \"corpus.tok\"\n";
  auto a = ParseSubmission(toml, "job.toml", Dir(), Roomy());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.training.steps, 0);
  EXPECT_EQ(a->spec.data.path, "");
  EXPECT_EQ(a->summary.steps(), 0);
}

// A sequence of `n` tokens in place of the spec's 64.
std::string WithSeqLen(std::string toml, int n) {
  const size_t at = toml.find("seq_len = 64");
  return toml.replace(at, 12, "seq_len = " + std::to_string(n));
}

TEST(AdmissionTest, BadSpecsNameTheKey) {
  struct Case {
    std::string toml, key;
  };
  std::vector<Case> cases = {
      {Spec("colour = \"red\"\n"), "colour"},
      // 4 heads: Ulysses cannot take 3 ranks, and a named ring of 1 leaves it all of them.
      {Spec("", "[parallel]\nworld = 3\nsp = 3\nring = 1\n"), "parallel.ring"},
      {Spec("", "[parallel]\nworld = 0\n"), "parallel.world"},
      {"name = \"t\"\n[model]\npreset = \"huge\"\n[data]\npath = \"corpus.tok\"\n", "model.preset"},
      {"name = \"t\"\n[data]\npath = \"missing.tok\"\n", "data.path"},
      {Spec("", "[training.extra]\n"), "training"},
      {Spec("", "[parallel]\nworld = 2\nsp = 2\n[memory]\nhead_chunk = 3\n"), "memory.head_chunk"},
      {std::string(Spec()).insert(Spec().find("preset"), "dtype = \"bf16\"\n"), "model.dtype"},
  };
  for (const Case& c : cases) {
    auto a = ParseSubmission(c.toml, "job.toml", Dir(), Roomy());
    ASSERT_FALSE(a.ok()) << c.toml;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
    EXPECT_NE(a.status().message().find(c.key), std::string::npos) << a.status();
  }
  EXPECT_EQ(ParseSubmission(Spec(), "job.toml", "relative/dir", Roomy()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // What Ulysses alone refused is taken now: 3 ranks over 4 heads as a ring of 3 (auto), and a
  // seq_len that sp does not divide (padded).
  for (const std::string& ok : {Spec("", "[parallel]\nworld = 3\nsp = 3\n"),
                                WithSeqLen(Spec("", "[parallel]\nworld = 2\nsp = 2\n"), 63)}) {
    auto a = ParseSubmission(ok, "job.toml", Dir(), Roomy());
    EXPECT_TRUE(a.ok()) << ok << "\n" << a.status();
  }
}

TEST(AdmissionTest, ModelThatDoesNotFitIsRejectedWithTheNumbers) {
  std::string toml =
      "name = \"big\"\n[model]\npreset = \"llama-3-8b\"\n"
      "[data]\npath = \"corpus.tok\"\nseq_len = 64\n[memory]\noptimizer_offload = false\n";
  const Node node = CpuNode(8, int64_t{24} << 30);
  auto a = ParseSubmission(toml, "job.toml", Dir(), node);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::MemoryPlan plan = EstimateMemory(*a);
  EXPECT_FALSE(plan.fits());
  // f32 params + grads and the f32 master + Adam m, v (20 bytes per parameter on one CPU rank),
  // plus the step's activations, which the planner counts too.
  EXPECT_GT(plan.per_rank_bytes(), a->config.NumParameters() * 20);
  EXPECT_LT(plan.per_rank_bytes(), a->config.NumParameters() * 24);
  // The rank's share of the host is its device: 85% of 24 GiB.
  EXPECT_EQ(plan.budget_bytes(), static_cast<int64_t>(0.85 * double(int64_t{24} << 30)));
  absl::Status st = CheckFits(*a, node);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("GiB per rank"), std::string::npos) << st;
  // A CPU job's "device" is its share of the host: the message says so, not "GPU".
  EXPECT_NE(st.message().find("of memory per rank (the CPU backend's share of the host)"),
            std::string::npos)
      << st;
  EXPECT_EQ(st.message().find("GPU"), std::string::npos) << st;
  // Sharded over 8 ranks with a large host budget (per rank) it fits.
  auto sharded = ParseSubmission(toml +
                                     "host_budget_gib = 125\n"  // in toml's [memory]
                                     "[parallel]\nworld = 8\nsp = 8\n",
                                 "job.toml", Dir(), node);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  const int64_t sharded_bytes = EstimateMemory(*sharded).per_rank_bytes();
  EXPECT_GT(sharded_bytes, a->config.NumParameters() * 20 / 8);
  // Plus the gathered units and their full-size gradients (the f32 embedding is 2 GiB).
  EXPECT_LT(sharded_bytes, a->config.NumParameters() * 28 / 8);
  EXPECT_TRUE(CheckFits(*sharded, node).ok());
}

// Optimizer state on the host: a plan over the host budget is refused naming the host tier and
// its bytes; "auto" admits Llama-3-8B at 128K on one H200 only by putting the state on the host.
TEST(AdmissionTest, OptimizerOffloadOverTheHostBudgetIsRefusedNamingTheTier) {
  const std::string toml =
      "name = \"big\"\nbackend = \"cuda\"\n[model]\npreset = \"llama-3-8b\"\n"
      "[data]\npath = \"corpus.tok\"\nseq_len = 131072\n[memory]\nrecompute = \"full\"\n";
  const Node small_host = GpuNode(1, int64_t{141} << 30, int64_t{64} << 30);
  auto a = ParseSubmission(toml + "optimizer_offload = true\n", "job.toml", Dir(), small_host);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::Status st = CheckFits(*a, small_host);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("of pinned host memory per rank ("), std::string::npos) << st;
  EXPECT_NE(st.message().find(
                absl::StrCat("host_optimizer ", HumanBytes(a->plan.peak[int(Tier::kHostOptimizer)]),
                             " (", a->plan.peak[int(Tier::kHostOptimizer)], " bytes)")),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("budget 54.40 GiB"), std::string::npos) << st;  // 85% of 64 GiB

  const Node device_host = GpuNode(1, int64_t{141} << 30, int64_t{125} << 30);
  auto chosen =
      ParseSubmission(toml + "optimizer_offload = \"auto\"\n", "job.toml", Dir(), device_host);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_TRUE(CheckFits(*chosen, device_host).ok()) << EstimateMemory(*chosen).summary();
  EXPECT_EQ(chosen->spec.memory.optimizer_offload, OffloadChoice::kOn);
  auto on_device =
      ParseSubmission(toml + "optimizer_offload = false\n", "job.toml", Dir(), device_host);
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  EXPECT_FALSE(CheckFits(*on_device, device_host).ok());
  // The plan that does not fit names the first change that makes it fit.
  EXPECT_NE(
      EstimateMemory(*on_device).summary().find("it fits with memory.optimizer_offload = \"auto\""),
      std::string::npos)
      << EstimateMemory(*on_device).summary();
  // "auto" is the default: the spec without the key fits the same way.
  auto by_default = ParseSubmission(toml, "job.toml", Dir(), device_host);
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_TRUE(CheckFits(*by_default, device_host).ok());
  EXPECT_EQ(by_default->spec.memory.optimizer_offload, OffloadChoice::kOn);
}

// A rank's host share is its node's host divided by the ranks on that node: world / slurm.nodes
// (it was the whole world, as if every rank of a 2-node job shared one host).
TEST(AdmissionTest, HostShareCountsTheRanksOnOneNode) {
  const std::string toml =
      "name = \"two\"\nbackend = \"cuda\"\n[model]\npreset = \"tiny\"\n"
      "[data]\npath = \"corpus.tok\"\nseq_len = 64\n[parallel]\nworld = 16\nsp = 4\n";
  const Node node = GpuNode(8, int64_t{80} << 30, int64_t{1024} << 30);
  auto two = ParseSubmission(toml + "[slurm]\nnodes = 2\n", "job.toml", Dir(), node);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->budgets.host_bytes, static_cast<int64_t>(0.85 * double(int64_t{1024} << 30)) / 8);
  const Node sixteen = GpuNode(16, int64_t{80} << 30, int64_t{1024} << 30);
  auto one = ParseSubmission(toml, "job.toml", Dir(), sixteen);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->budgets.host_bytes, static_cast<int64_t>(0.85 * double(int64_t{1024} << 30)) / 16);
}

// `ithaca plan --hardware h100x8` (and a daemon whose GPUs are H100s) predicts with the H100's
// rates, h200x8 with the H200's, and the plan says which (issue 54 U5).
TEST(AdmissionTest, APlanUsesTheRatesOfItsNodesGpusAndNamesThem) {
  const std::string toml =
      "name = \"r\"\nbackend = \"cuda\"\n[model]\npreset = \"tiny\"\n"
      "[data]\npath = \"corpus.tok\"\nseq_len = 1024\n";
  for (auto [hardware, rates] :
       {std::pair{"h100x8", "h100"}, std::pair{"h200x8", "h200"}, std::pair{"h100x1", "h100"}}) {
    SCOPED_TRACE(hardware);
    absl::StatusOr<Node> node = HardwareNode(hardware);
    ASSERT_TRUE(node.ok()) << node.status();
    auto a = ParseSubmission(toml, "job.toml", Dir(), *node);
    ASSERT_TRUE(a.ok()) << a.status();
    const v1::MemoryPlan plan = EstimateMemory(*a);
    EXPECT_GT(plan.predicted_step_s(), 0);
    // Where the time goes, in parts that make the step.
    const v1::MemoryPlan::PredictedTime& t = plan.predicted_time();
    EXPECT_GT(t.attention_s(), 0);
    EXPECT_GT(t.gemm_s(), 0);
    EXPECT_GT(t.forward_s(), 0);
    EXPECT_NEAR(plan.predicted_step_s(),
                double(t.samples()) * t.forward_backward_s() + t.update_s(),
                1e-9 * plan.predicted_step_s());
    EXPECT_EQ(plan.rates(), rates);
    EXPECT_NE(plan.summary().find(absl::StrCat("rates: ", rates)), std::string::npos)
        << plan.summary();
  }
  Node h100 = GpuNode(8, int64_t{80} << 30, int64_t{2048} << 30);
  for (NodeDevice& d : h100.devices) d.name = "NVIDIA H100 80GB HBM3";
  auto a = ParseSubmission(toml, "job.toml", Dir(), h100);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(EstimateMemory(*a).rates(), "h100");
  auto b =
      ParseSubmission(toml, "job.toml", Dir(), GpuNode(8, int64_t{141} << 30, int64_t{2048} << 30));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(EstimateMemory(*b).rates(), "h200");
}

TEST(AdmissionTest, NodeLimits) {
  const Node node = CpuNode(2, int64_t{16} << 30);
  // Refused before anything that depends on the world size is looked at.
  auto a = ParseSubmission(Spec("", "[parallel]\nworld = 4\nsp = 2\n"), "job.toml", Dir(), node);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("parallel.world: the job needs 4 ranks; this node has 2 "
                                      "CPU slots"),
            std::string::npos)
      << a.status();
  auto hundred = ParseSubmission(Spec("", "[parallel]\nworld = 100\n"), "job.toml", Dir(), node);
  ASSERT_FALSE(hundred.ok());
  EXPECT_NE(hundred.status().message().find("needs 100 ranks"), std::string::npos)
      << hundred.status();
  auto two = ParseSubmission(Spec("", "[parallel]\nworld = 2\nsp = 2\n"), "job.toml", Dir(), node);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(CheckSlots(two->spec, node).ok());
  auto cuda = ParseSubmission("backend = \"cuda\"\n" + Spec().substr(Spec().find("[model]")),
                              "job.toml", Dir(), node);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("backend"), std::string::npos) << cuda.status();
}

// Admission and a worker apply the same budget rule to the same node, so they resolve a job to
// the same spec: the daemon from its Node, a standalone worker from what its process sees
// (LocalNodeResources, as worker/standalone.cc calls it).
TEST(AdmissionTest, AdmissionAndAWorkerResolveTheSameSpecOnTheSameNode) {
  const std::string toml =
      "name = \"same\"\n[model]\npreset = \"tiny\"\n[data]\npath = \"corpus.tok\"\n"
      "seq_len = 512\n[parallel]\nworld = 2\nsp = 2\n";
  // The CPU: this host as ithacad detects it, 2 slots.
  NodeOptions options;
  options.cpu_slots = 2;
  const Node cpu = DetectNode(options);
  // A GPU node; a worker reads the same GPU memory from cudaMemGetInfo.
  const int64_t gpu_bytes = int64_t{3} << 30, host_bytes = cpu.host_memory_bytes;
  const Node gpu = GpuNode(2, gpu_bytes, host_bytes);
  for (const auto& [backend, node, device_bytes] :
       {std::tuple<std::string, Node, int64_t>{"cpu", cpu, 0}, {"cuda", gpu, gpu_bytes}}) {
    SCOPED_TRACE(backend);
    auto admitted =
        ParseSubmission("backend = \"" + backend + "\"\n" + toml, "job.toml", Dir(), node);
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    // The worker's side: the spec as loaded (paths absolute), this process's view of the host.
    auto loaded = ParseJobSpec("backend = \"" + backend + "\"\n" + toml);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    loaded->data.path = admitted->spec.data.path;
    const NodeResources here = LocalNodeResources(device_bytes, 2);
    const RankBudgets worker_budgets = BudgetsFor(*loaded, here);
    EXPECT_EQ(worker_budgets.gpu_bytes, admitted->budgets.gpu_bytes);
    EXPECT_EQ(worker_budgets.host_bytes, admitted->budgets.host_bytes);
    auto worker = ResolveJob(*loaded, here);
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_EQ(worker->toml, admitted->toml);
    // And a worker handed the admitted spec runs it as it is.
    auto sent = ParseJobSpec(admitted->toml);
    ASSERT_TRUE(sent.ok()) << sent.status();
    auto again = ResolveJob(*sent, here);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->toml, admitted->toml);
  }
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Every path of a spec must resolve inside an allowed root; a link inside a root that leads
// out of it does not count as inside.
// init.from = "job:ID": the daemon's lookup turns it into that job's checkpoint.dir; a job whose
// checkpoints are still to come is admitted without them, a path must hold weights now.
TEST(AdmissionTest, InitFromAJobBecomesItsCheckpointDir) {
  WriteCorpus(Dir() + "/corpus.tok");
  const std::string toml = Spec("[init]\nfrom = \"job:job-4\"\n");
  absl::Status none = ParseSubmission(toml, "job.toml", Dir(), Roomy()).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument) << none;
  EXPECT_NE(none.message().find("job.toml: init.from: \"job:job-4\" names a job"),
            std::string::npos)
      << none;
  const std::string later = Dir() + "/phase1-ckpt";
  std::string asked;
  auto lookup = [&](const std::string& id) -> absl::StatusOr<InitJob> {
    asked = id;
    return InitJob{later, /*ended=*/false};
  };
  absl::StatusOr<AdmittedSpec> a =
      ParseSubmission(toml, "job.toml", Dir(), Roomy(), "", {}, nullptr, lookup);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(asked, "job-4");
  EXPECT_EQ(a->spec.init.from, later);
  EXPECT_EQ(a->summary.init_from(), later);
  EXPECT_NE(a->toml.find("[init]\nfrom = \"" + later + "\""), std::string::npos) << a->toml;
  // Ended, its checkpoint.dir must hold weights now.
  auto ended = [&](const std::string&) -> absl::StatusOr<InitJob> {
    return InitJob{later, /*ended=*/true};
  };
  absl::Status missing =
      ParseSubmission(toml, "job.toml", Dir(), Roomy(), "", {}, nullptr, ended).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  EXPECT_NE(missing.message().find("job.toml: init.from: " + later + ": no such directory"),
            std::string::npos)
      << missing;
  auto unknown = [](const std::string& id) -> absl::StatusOr<InitJob> {
    return absl::NotFoundError("job:" + id + ": no such job");
  };
  absl::Status st =
      ParseSubmission(toml, "job.toml", Dir(), Roomy(), "", {}, nullptr, unknown).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_EQ(st.message(), "job.toml: init.from: job:job-4: no such job");
  // The summary names the RoPE, and the warning a context past the model's names its keys.
  absl::StatusOr<AdmittedSpec> rope =
      ParseSubmission(Spec("[model.rope]\ntheta = 40000\n"), "job.toml", Dir(), Roomy());
  ASSERT_TRUE(rope.ok()) << rope.status();
  EXPECT_EQ(rope->summary.rope().rfind("rope_theta 40000, llama3 factor 8", 0), 0u)
      << rope->summary.rope();
  EXPECT_TRUE(rope->warnings.empty());
}

TEST(AllowedRootsTest, PathsOutsideTheRootsAreRefusedNamingTheKey) {
  const std::string root = Dir() + "/roots/allowed";
  const std::string outside = Dir() + "/roots/outside";
  ASSERT_EQ(system(("mkdir -p " + root + "/models " + outside).c_str()), 0);
  WriteCorpus(root + "/corpus.tok");
  WriteCorpus(outside + "/secret.tok");
  std::ofstream(outside + "/config.json") << "{}";
  unlink((root + "/escape").c_str());
  ASSERT_EQ(symlink(outside.c_str(), (root + "/escape").c_str()), 0);
  auto roots = ParseAllowedRoots(root);
  ASSERT_TRUE(roots.ok()) << roots.status();

  auto spec = [&](const std::string& data, const std::string& model, const std::string& ckpt) {
    return "name = \"t\"\nbackend = \"cpu\"\n[model]\n" + model + "\n[data]\npath = \"" + data +
           "\"\nseq_len = 64\n[training]\nsteps = 3\n" +
           (ckpt.empty() ? "" : "[checkpoint]\ndir = \"" + ckpt + "\"\n");
  };
  auto admit = [&](const std::string& toml) {
    return ParseSubmission(toml, "job.toml", root, Roomy(), "", *roots).status();
  };
  ASSERT_TRUE(admit(spec("corpus.tok", "preset = \"tiny\"", "ckpt/run1")).ok());

  struct Case {
    std::string toml, key;
  };
  for (const Case& c : {
           Case{spec("escape/secret.tok", "preset = \"tiny\"", ""), "data.path"},
           Case{spec(outside + "/secret.tok", "preset = \"tiny\"", ""), "data.path"},
           Case{spec("escape/*.tok", "preset = \"tiny\"", ""), "data.path"},
           Case{spec("corpus.tok", "config = \"escape/config.json\"", ""), "model.config"},
           Case{spec("corpus.tok", "config = \"/etc/shadow\"", ""), "model.config"},
           Case{spec("corpus.tok", "weights = \"escape\"", ""), "model.weights"},
           Case{spec("corpus.tok", "preset = \"tiny\"", "escape/ckpt"), "checkpoint.dir"},
           Case{spec("corpus.tok", "preset = \"tiny\"", "/var/tmp/ckpt"), "checkpoint.dir"},
           Case{spec("corpus.tok", "preset = \"tiny\"", "../outside/new"), "checkpoint.dir"},
           Case{spec("corpus.tok", "preset = \"tiny\"\n[init]\nfrom = \"escape\"", ""),
                "init.from"},
           Case{spec("corpus.tok", "preset = \"tiny\"\n[init]\nfrom = \"/etc\"", ""), "init.from"},
       }) {
    absl::Status st = admit(c.toml);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << c.toml << "\n" << st;
    const std::string msg(st.message());
    EXPECT_NE(msg.find("job.toml: " + c.key + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find("outside the allowed roots " + (*roots)[0]), std::string::npos) << msg;
  }
  // A glob's matches are checked one by one: a link among them is refused.
  unlink((root + "/models/link.tok").c_str());
  ASSERT_EQ(symlink((outside + "/secret.tok").c_str(), (root + "/models/link.tok").c_str()), 0);
  WriteCorpus(root + "/models/a.tok");
  absl::Status glob = admit(spec("models/*.tok", "preset = \"tiny\"", ""));
  EXPECT_EQ(glob.code(), absl::StatusCode::kPermissionDenied) << glob;
  EXPECT_NE(glob.message().find("link.tok"), std::string::npos) << glob;
  // A weights directory whose shard is a link out of the root is refused; other links beside it
  // (never read) do not matter.
  ASSERT_EQ(system(("mkdir -p " + root + "/weights").c_str()), 0);
  unlink((root + "/weights/model.safetensors").c_str());
  unlink((root + "/weights/notes").c_str());
  ASSERT_EQ(symlink((outside + "/secret.tok").c_str(), (root + "/weights/notes").c_str()), 0);
  absl::Status weights = admit(spec("corpus.tok", "weights = \"weights\"", ""));
  EXPECT_NE(weights.code(), absl::StatusCode::kPermissionDenied) << weights;
  ASSERT_EQ(
      symlink((outside + "/secret.tok").c_str(), (root + "/weights/model.safetensors").c_str()), 0);
  weights = admit(spec("corpus.tok", "weights = \"weights\"", ""));
  EXPECT_EQ(weights.code(), absl::StatusCode::kPermissionDenied) << weights;
  EXPECT_NE(weights.message().find("model.weights: " + root + "/weights/model.safetensors"),
            std::string::npos)
      << weights;
  // ".." below a directory that does not exist yet cannot be judged: refused.
  EXPECT_FALSE(admit(spec("corpus.tok", "preset = \"tiny\"", "new/../../outside/x")).ok());
  // Without roots (library callers) nothing is restricted.
  EXPECT_TRUE(ParseSubmission(spec(outside + "/secret.tok", "preset = \"tiny\"", ""), "job.toml",
                              root, Roomy())
                  .ok());
}

// A safetensors index is data too: the shards its weight_map names (through model.weights and
// init.from) are checked against the roots before anything is opened, as ithacad does at
// admission (it holds its roots in $ITHACA_ALLOWED_ROOTS, as its workers do). A file outside
// (one that exists, a real safetensors file, or none at all) gets one answer that quotes none
// of its bytes; names that leave the index's directory are refused outright (issue 53 R1).
TEST(AllowedRootsTest, TheShardsAnIndexNamesAreCheckedBeforeAnyIsOpened) {
  const std::string root = Dir() + "/index-roots/allowed";
  const std::string outside = Dir() + "/index-roots/outside";
  ASSERT_EQ(system(("rm -rf " + root + " " + outside + " && mkdir -p " + root + "/w " + root +
                    "/hf " + outside)
                       .c_str()),
            0);
  WriteCorpus(root + "/corpus.tok");
  const std::string config = ConfigToJson(*PresetConfig("tiny"));
  std::ofstream(root + "/w/config.json") << config;
  std::ofstream(root + "/hf/config.json") << config;
  std::ofstream(outside + "/shadow") << "root:*:20000:0:99999:7:::\n";
  SafetensorsWriter real;
  const std::vector<float> two = {1, 2};
  real.Add("model.norm.weight", DType::kF32, {2}, two.data(), DType::kF32);
  ASSERT_TRUE(real.WriteFile(outside + "/real.safetensors").ok());
  for (const std::string& dir : {root + "/w", root + "/hf"}) {
    ASSERT_EQ(symlink((outside + "/shadow").c_str(), (dir + "/shard-shadow").c_str()), 0);
    ASSERT_EQ(symlink((outside + "/real.safetensors").c_str(), (dir + "/shard-real").c_str()), 0);
    ASSERT_EQ(symlink((outside + "/no-such-file").c_str(), (dir + "/shard-missing").c_str()), 0);
  }
  auto roots = ParseAllowedRoots(root);
  ASSERT_TRUE(roots.ok()) << roots.status();
  ASSERT_EQ(setenv(kAllowedRootsEnv, (*roots)[0].c_str(), 1), 0);
  auto check = [&](const std::string& model, const std::string& extra) {
    absl::StatusOr<AdmittedSpec> a = ParseSubmission(
        "name = \"t\"\nbackend = \"cpu\"\n[model]\n" + model +
            "\n[data]\npath = \"corpus.tok\"\nseq_len = 64\n[training]\nsteps = 3\n" + extra,
        "job.toml", root, Roomy(), "", *roots);
    return a.ok() ? CheckInputs(*a, "job.toml") : a.status();
  };
  auto index = [&](const std::string& dir, const std::string& shard) {
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"model.norm.weight": ")" + shard + R"("}})";
  };
  struct Case {
    std::string dir, model, extra, key;
  };
  for (const Case& c :
       {Case{root + "/w", "config = \"w/config.json\"\nweights = \"w\"", "", "model.weights"},
        Case{root + "/hf", "preset = \"tiny\"", "[init]\nfrom = \"hf\"\n", "init.from"}}) {
    // Links beside the index that lead out of the roots: refused alike whether what they lead
    // to exists, is a real safetensors file, or is not one.
    std::vector<absl::Status> refusals;
    for (const char* shard : {"shard-shadow", "shard-real", "shard-missing"}) {
      index(c.dir, shard);
      absl::Status st = check(c.model, c.extra);
      EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << shard << ": " << st;
      EXPECT_EQ(st.message().rfind("job.toml: " + c.key + ": ", 0), 0u) << st;
      EXPECT_NE(st.message().find(absl::StrCat("shard ", shard, " (holding 'model.norm.weight'): ",
                                               c.dir, "/", shard, " is outside the allowed roots")),
                std::string::npos)
          << st;
      refusals.push_back(st);
    }
    for (const absl::Status& st : refusals) {
      const std::string msg(st.message());
      EXPECT_EQ(msg.find("root:"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("header"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("such file"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("bytes"), std::string::npos) << msg;
    }
    // Names that leave the index's directory, existing or not, are refused before any open.
    for (const std::string& shard :
         {std::string("../../outside/real.safetensors"), std::string("../../outside/nothing"),
          outside + "/shadow", std::string("/etc/shadow")}) {
      index(c.dir, shard);
      absl::Status st = check(c.model, c.extra);
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << shard << ": " << st;
      EXPECT_EQ(st.message().rfind("job.toml: " + c.key + ": ", 0), 0u) << st;
      EXPECT_NE(st.message().find("which is not a file name beside the index"), std::string::npos)
          << st;
      EXPECT_EQ(st.message().find("root:"), std::string::npos) << st;
    }
  }
  unsetenv(kAllowedRootsEnv);
}

// Every brace alternative of data.path is checked against the roots before it is looked at: no
// existence oracle ("../etc/no-such-file" and an existing file outside answer alike), no
// listing of a directory outside one name at a time.
TEST(AllowedRootsTest, EveryBraceAlternativeIsCheckedBeforeItIsLookedAt) {
  const std::string root = Dir() + "/alternatives/allowed";
  const std::string outside = Dir() + "/alternatives/outside";
  ASSERT_EQ(system(("mkdir -p " + root + " " + outside + "/dir").c_str()), 0);
  WriteCorpus(root + "/corpus.tok");
  std::ofstream(outside + "/dir/private-name.tok") << "x";
  auto roots = ParseAllowedRoots(root);
  ASSERT_TRUE(roots.ok()) << roots.status();
  auto admit = [&](const std::string& data) {
    return ParseSubmission(
               "name = \"t\"\nbackend = \"cpu\"\n[model]\npreset = \"tiny\"\n"
               "[data]\npath = \"" +
                   data + "\"\nseq_len = 64\n[training]\nsteps = 3\n",
               "job.toml", root, Roomy(), "", *roots)
        .status();
  };
  const absl::Status exists = admit("{corpus.tok,../outside/dir/private-name.tok}");
  const absl::Status missing = admit("{corpus.tok,../outside/dir/no-such-file}");
  const absl::Status listing = admit("{corpus.tok,../outside/dir/*}");
  for (const absl::Status& st : {exists, missing, listing}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
    EXPECT_NE(st.message().find("job.toml: data.path: "), std::string::npos) << st;
    EXPECT_NE(st.message().find("outside the allowed roots"), std::string::npos) << st;
  }
  EXPECT_EQ(listing.message().find("private-name"), std::string::npos) << listing;
  // A wildcard then ".." (N1): the path is cleaned before anything is looked at, so a file that
  // exists outside the roots and one that does not get the same answer.
  ASSERT_EQ(system(("mkdir -p " + root + "/jobs").c_str()), 0);  // something for j* to match
  const std::string up = root + "/j*/../../outside/dir/";
  const absl::Status up_exists = admit(up + "private-name.tok");
  const absl::Status up_missing = admit(up + "no-such-file");
  for (const absl::Status& st : {up_exists, up_missing}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  }
  // Inside the roots a typo in one alternative names it.
  const absl::Status typo = admit("{corpus.tok,corpus.tokk}");
  EXPECT_EQ(typo.code(), absl::StatusCode::kInvalidArgument) << typo;
  EXPECT_NE(typo.message().find("corpus.tokk: no such file"), std::string::npos) << typo;
}

// What a worker used to find only after its launch (a slot taken, ranks started) is refused at
// admission (CheckInputs, which SubmitJob runs): an evaluation set too small for eval.batches,
// weights in a dtype Ithaca does not read or missing a tensor, and data made with another tokenizer
// than the model's.
TEST(AdmissionTest, InputsTheWorkersWouldRefuseAreRefusedAtAdmission) {
  const std::string dir = Dir() + "/inputs";
  ASSERT_EQ(system(("mkdir -p " + dir + "/model").c_str()), 0);
  WriteCorpus(dir + "/corpus.tok");
  auto check = [&](const std::string& toml) {
    absl::StatusOr<AdmittedSpec> a = ParseSubmission(toml, "job.toml", dir, Roomy());
    return a.ok() ? CheckInputs(*a, "job.toml") : a.status();
  };
  auto admit = [&](const std::string& model, const std::string& extra) {
    return check("name = \"t\"\nbackend = \"cpu\"\n[model]\n" + model +
                 "\n[data]\npath = \"corpus.tok\"\nseq_len = 64\n[training]\nsteps = 3\n" + extra);
  };
  ASSERT_TRUE(admit("preset = \"tiny\"", "[eval]\npath = \"corpus.tok\"\nbatches = 4\n").ok());
  absl::Status eval = admit("preset = \"tiny\"", "[eval]\npath = \"corpus.tok\"\nbatches = 1000\n");
  EXPECT_EQ(eval.code(), absl::StatusCode::kInvalidArgument) << eval;
  EXPECT_NE(eval.message().find("job.toml: eval.path: "), std::string::npos) << eval;
  EXPECT_NE(eval.message().find("(eval.batches 1000 x data.micro_batch 1 x 1 data-parallel "
                                "replicas): lower eval.batches or add data"),
            std::string::npos)
      << eval;

  // A safetensors file of one F16 tensor: its header names the dtype.
  const std::string header =
      R"({"model.embed_tokens.weight":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  {
    std::ofstream f(dir + "/model/model.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(4, '\0');
  }
  std::ofstream(dir + "/model/config.json") << ConfigToJson(*PresetConfig("tiny"));
  absl::Status f16 = admit("config = \"model/config.json\"\nweights = \"model\"", "");
  EXPECT_EQ(f16.code(), absl::StatusCode::kInvalidArgument) << f16;
  EXPECT_NE(f16.message().find("job.toml: model.weights: "), std::string::npos) << f16;
  EXPECT_NE(f16.message().find("has dtype F16, which Ithaca does not read"), std::string::npos)
      << f16;
  // Weights that lack a tensor of the config.
  SafetensorsWriter w;
  const std::vector<float> two = {1, 2};
  w.Add("model.norm.weight", DType::kF32, {2}, two.data(), DType::kF32);
  ASSERT_TRUE(w.WriteFile(dir + "/model/model.safetensors").ok());
  absl::Status missing = admit("config = \"model/config.json\"\nweights = \"model\"", "");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  EXPECT_NE(missing.message().find("has no tensor 'model.embed_tokens.weight', which the model's "
                                   "config needs"),
            std::string::npos)
      << missing;
  // init.from's weights are checked the same way, under their own key.
  absl::Status init = admit("preset = \"tiny\"", "[init]\nfrom = \"model\"\n");
  EXPECT_EQ(init.code(), absl::StatusCode::kInvalidArgument) << init;
  EXPECT_EQ(init.message().rfind("job.toml: init.from: " + dir +
                                     "/model has no tensor "
                                     "'model.embed_tokens.weight'",
                                 0),
            0u)
      << init;

  // init.from's config.json must be the job's model (issue 53: it was not read): another
  // rms_norm_eps, whose tensors have the same shapes, is named with both values.
  LlamaConfig other_eps = *PresetConfig("tiny");
  other_eps.rms_norm_eps = 1e-6;
  std::ofstream(dir + "/model/config.json") << ConfigToJson(other_eps);
  absl::Status eps = admit("preset = \"tiny\"", "[init]\nfrom = \"model\"\n");
  EXPECT_EQ(eps.code(), absl::StatusCode::kFailedPrecondition) << eps;
  EXPECT_EQ(eps.message().rfind("job.toml: init.from: " + dir +
                                    "/model/config.json has rms_norm_eps 1e-06, the job's model "
                                    "1e-05: ",
                                0),
            0u)
      << eps;
  std::ofstream(dir + "/model/config.json") << ConfigToJson(*PresetConfig("tiny"));

  // Data tokenized with another tokenizer than the model directory's tokenizer.json.
  std::ofstream(dir + "/model/tokenizer.json") << R"({"model": {"type": "BPE"}})";
  TokenFileMeta meta = ByteTokenMeta(ByteTokenize(std::string(200, 'x')));
  meta.fingerprint = Sha256("another tokenizer", 17);
  ASSERT_TRUE(WriteTokenFileV2(dir + "/other.tok", ByteTokenize(std::string(200, 'x')), meta).ok());
  const std::string other =
      "name = \"t\"\nbackend = \"cpu\"\n[model]\nconfig = \"model/config.json\"\n"
      "[data]\npath = \"other.tok\"\nseq_len = 64\n[training]\nsteps = 3\n";
  absl::Status tokenizer = check(other);
  EXPECT_EQ(tokenizer.code(), absl::StatusCode::kInvalidArgument) << tokenizer;
  EXPECT_NE(tokenizer.message().find("but the model's tokenizer " + dir + "/model/tokenizer.json"),
            std::string::npos)
      << tokenizer;

  // [eval.passkey]: a length too short for the prompts in the model's tokenizer (byte-level
  // here), and a tokenizer.json the engine cannot encode with (that one above: no vocab).
  absl::Status short_prompt = admit("preset = \"tiny\"", "[eval.passkey]\nlengths = [32, 64]\n");
  EXPECT_EQ(short_prompt.code(), absl::StatusCode::kInvalidArgument) << short_prompt;
  EXPECT_NE(short_prompt.message().find("job.toml: eval.passkey.lengths: 32 tokens cannot hold a "
                                        "passkey prompt"),
            std::string::npos)
      << short_prompt;
  const std::string bpe =
      "name = \"t\"\nbackend = \"cpu\"\n[model]\nconfig = \"model/config.json\"\n"
      "[data]\nseq_len = 256\n[training]\nsteps = 0\nlr = 0\n"
      "[eval.passkey]\nlengths = [256]\n";
  absl::Status unreadable = check(bpe);
  EXPECT_EQ(unreadable.code(), absl::StatusCode::kInvalidArgument) << unreadable;
  EXPECT_NE(unreadable.message().find("job.toml: eval.passkey: the model's tokenizer: " + dir +
                                      "/model/tokenizer.json: model.vocab is not an object"),
            std::string::npos)
      << unreadable;
}

// A 289-byte data.path must not cost seconds and hundreds of MB of admission (2^21 brace
// alternatives), and an admission whose client went away stops.
TEST(AdmissionTest, DataPatternsAreBoundedAndCancellable) {
  const std::string dir = Dir() + "/bounded";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  WriteCorpus(dir + "/corpus.tok");
  auto spec = [](const std::string& data) {
    return "name = \"t\"\nbackend = \"cpu\"\n[model]\npreset = \"tiny\"\n[data]\npath = \"" + data +
           "\"\nseq_len = 64\n[training]\nsteps = 3\n";
  };
  std::string groups;
  for (int i = 0; i < 21; ++i) groups += "{,}";
  const absl::Time start = absl::Now();
  absl::Status st = ParseSubmission(spec("corpus.tok" + groups), "job.toml", dir, Roomy()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("job.toml: data.path: "), std::string::npos) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  st = ParseSubmission(spec("{corpus,other}.tok"), "job.toml", dir, Roomy(), "", {}, [] {
         return true;
       }).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_TRUE(ParseSubmission(spec("{corpus,corpus}.tok"), "job.toml", dir, Roomy()).ok());
}

TEST(AllowedRootsTest, ResolveBeneathExisting) {
  const std::string base = Dir() + "/resolve";
  ASSERT_EQ(system(("mkdir -p " + base + "/real").c_str()), 0);
  unlink((base + "/link").c_str());
  ASSERT_EQ(symlink((base + "/real").c_str(), (base + "/link").c_str()), 0);
  char real_base[PATH_MAX];
  ASSERT_NE(realpath(base.c_str(), real_base), nullptr);
  auto r = ResolveBeneathExisting(base + "/link/a/b");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, std::string(real_base) + "/real/a/b");
  EXPECT_FALSE(ResolveBeneathExisting("relative/path").ok());
  EXPECT_FALSE(ParseAllowedRoots(base + "/missing").ok());
  EXPECT_FALSE(ParseAllowedRoots("").ok());
}

}  // namespace
}  // namespace ithaca
