// The host waits for the device only where the loop reports (docs/schedules.md, "no
// host sync inside a step except where the loop reports"). A recording Ops
// around the CPU oracle logs every call of every training step, and each step
// must:
//   1. stream its inputs: each of the rank's samples (ids and labels) is copied
//   with CopyAsync, which makes the host wait for nothing, and the compute
//   stream waits for it (WaitFence) before that sample's forward;
//   2. make no other call that waits for the device (Upload, Download, Sum,
//   SumSquares,
//      Synchronize) until its one read of the loss and the gradient norm (a
//      Download), which comes after every gradient and loss reduction and
//      before the first AdamW;
//   3. end with one Synchronize (the step's time), after its last AdamW.
// On CUDA each of those calls is a stream synchronization; so a change that
// adds one to the step (a Sum in the loss head, a SumSquares per unit, an
// Upload of a micro-batch's tokens) fails here. One rank with gradient accumulation
// and offload, and two Gloo ranks (processes) with sharded and replicated
// gradients and with Ulysses.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "engine/backend/cpu/cpu_ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/plan/resolve.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

// Forwards every op to `inner` and logs its name.
class RecordingOps final : public Ops {
 public:
  explicit RecordingOps(Ops* inner) : inner_(inner) {}
  std::vector<std::string>& log() { return log_; }

  Device device() const override { return inner_->device(); }
  DType act_dtype() const override { return inner_->act_dtype(); }
  double PeakFlops() const override { return inner_->PeakFlops(); }
  void Fill(const Tensor& x, float v) override {
    Log("Fill");
    inner_->Fill(x, v);
  }
  void Copy(const Tensor& s, const Tensor& d) override {
    Log("Copy");
    inner_->Copy(s, d);
  }
  void Copy2D(const Tensor& s, int64_t ss, const Tensor& d, int64_t ds, int64_t rows,
              int64_t cols) override {
    Log("Copy2D");
    inner_->Copy2D(s, ss, d, ds, rows, cols);
  }
  Fence CopyAsync(const Tensor& s, const Tensor& d) override {
    Log("CopyAsync");
    return inner_->CopyAsync(s, d);
  }
  void WaitFence(Fence f) override {
    Log("WaitFence");
    inner_->WaitFence(f);
  }
  void Upload(const void* h, DType t, const Tensor& d) override {
    Log("Upload");
    inner_->Upload(h, t, d);
  }
  void Download(const Tensor& s, void* h, DType t) override {
    Log("Download");
    inner_->Download(s, h, t);
  }
  void Axpy(float a, const Tensor& x, const Tensor& y) override {
    Log("Axpy");
    inner_->Axpy(a, x, y);
  }
  void Synchronize() const override {
    log_.push_back("Synchronize");
    inner_->Synchronize();
  }
  double SumSquares(const Tensor& x) override {
    Log("SumSquares");
    return inner_->SumSquares(x);
  }
  double Sum(const Tensor& x) override {
    Log("Sum");
    return inner_->Sum(x);
  }
  void SumSquaresInto(const Tensor& x, const Tensor& o) override {
    Log("SumSquaresInto");
    inner_->SumSquaresInto(x, o);
  }
  void SumInto(const Tensor& x, const Tensor& o) override {
    Log("SumInto");
    inner_->SumInto(x, o);
  }
  void Gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, float alpha,
            float beta) override {
    Log("Gemm");
    inner_->Gemm(a, ta, b, tb, c, alpha, beta);
  }
  void GemmBias(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& bias,
                const Tensor& c, float alpha, float beta) override {
    Log("GemmBias");
    inner_->GemmBias(a, ta, b, tb, bias, c, alpha, beta);
  }
  void Embedding(const Tensor& i, const Tensor& t, const Tensor& o) override {
    Log("Embedding");
    inner_->Embedding(i, t, o);
  }
  void EmbeddingBackward(const Tensor& i, const Tensor& d, const Tensor& g) override {
    Log("EmbeddingBackward");
    inner_->EmbeddingBackward(i, d, g);
  }
  void RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& o,
               const Tensor& r) override {
    Log("RmsNorm");
    inner_->RmsNorm(x, w, eps, o, r);
  }
  void RmsNormBackward(const Tensor& x, const Tensor& w, const Tensor& r, const Tensor& d,
                       const Tensor& dx, const Tensor& dw) override {
    Log("RmsNormBackward");
    inner_->RmsNormBackward(x, w, r, d, dx, dw);
  }
  void RmsNormBackwardInPlace(const Tensor& x, const Tensor& w, float eps, const Tensor& g,
                              const Tensor& dw) override {
    Log("RmsNormBackwardInPlace");
    inner_->RmsNormBackwardInPlace(x, w, eps, g, dw);
  }
  void Rope(const Tensor& x, int64_t p, const Tensor& f, bool inv,
            const DocumentMask& docs) override {
    Log("Rope");
    inner_->Rope(x, p, f, inv, docs);
  }
  void Attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                 const Tensor& l, const DocumentMask& docs) override {
    Log("Attention");
    inner_->Attention(q, k, v, o, l, docs);
  }
  void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& d, const Tensor& l, const Tensor& dq, const Tensor& dk,
                         const Tensor& dv, const DocumentMask& docs) override {
    Log("AttentionBackward");
    inner_->AttentionBackward(q, k, v, o, d, l, dq, dk, dv, docs);
  }
  void AttentionChunk(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                      const Tensor& l, const DocumentMask& docs, int64_t qp, int64_t kp) override {
    Log("AttentionChunk");
    inner_->AttentionChunk(q, k, v, o, l, docs, qp, kp);
  }
  void AttentionChunkBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& d, const Tensor& l, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const DocumentMask& docs, int64_t qp,
                              int64_t kp) override {
    Log("AttentionChunkBackward");
    inner_->AttentionChunkBackward(q, k, v, o, d, l, dq, dk, dv, docs, qp, kp);
  }
  void AttentionMerge(const Tensor& a, const Tensor& al, const Tensor& o,
                      const Tensor& l) override {
    Log("AttentionMerge");
    inner_->AttentionMerge(a, al, o, l);
  }
  void SwiGLU(const Tensor& g, const Tensor& u, const Tensor& o) override {
    Log("SwiGLU");
    inner_->SwiGLU(g, u, o);
  }
  void SwiGLUBackward(const Tensor& g, const Tensor& u, const Tensor& d, const Tensor& dg,
                      const Tensor& du) override {
    Log("SwiGLUBackward");
    inner_->SwiGLUBackward(g, u, d, dg, du);
  }
  void CrossEntropy(const Tensor& l, const Tensor& y, const Tensor& loss, const Tensor& d,
                    float s) override {
    Log("CrossEntropy");
    inner_->CrossEntropy(l, y, loss, d, s);
  }
  void LabelIsArgmax(const Tensor& l, const Tensor& y, const Tensor& hits) override {
    Log("LabelIsArgmax");
    inner_->LabelIsArgmax(l, y, hits);
  }
  void AdamW(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& work,
             const AdamWParams& p) override {
    Log("AdamW");
    inner_->AdamW(w, g, m, v, work, p);
  }

 private:
  void Log(const char* op) { log_.push_back(op); }
  Ops* inner_;
  mutable std::vector<std::string> log_;
};

bool Waits(const std::string& op) {
  return op == "Upload" || op == "Download" || op == "Sum" || op == "SumSquares" ||
         op == "Synchronize";
}

// "" when one step's calls follow the rules at the top, else what breaks them.
std::string CheckStep(const std::vector<std::string>& calls, int64_t samples) {
  // Each sample's copies: CopyAsync ids, CopyAsync labels, WaitFence (offload's copies do not
  // come in pairs before a fence).
  size_t staged = 0;
  for (size_t i = 2; i < calls.size(); ++i) {
    staged += calls[i - 2] == "CopyAsync" && calls[i - 1] == "CopyAsync" && calls[i] == "WaitFence";
  }
  if (staged < static_cast<size_t>(samples)) {
    return absl::StrCat(staged, " samples streamed in with CopyAsync, want ", samples);
  }
  const size_t first = 0;
  std::vector<size_t> waits;
  size_t sum_into = 0, last_reduction = 0, first_adamw = calls.size(), last_adamw = 0;
  for (size_t i = first; i < calls.size(); ++i) {
    const std::string& op = calls[i];
    if (Waits(op)) waits.push_back(i);
    if (op == "SumInto") ++sum_into;
    if (op == "SumInto" || op == "SumSquaresInto") last_reduction = i;
    if (op == "AdamW") {
      first_adamw = std::min(first_adamw, i);
      last_adamw = i;
    }
  }
  std::string seen;
  for (size_t i : waits) absl::StrAppend(&seen, " ", calls[i], "@", i);
  if (waits.size() != 2 || calls[waits[0]] != "Download" || calls[waits[1]] != "Synchronize") {
    return absl::StrCat("the step waits at", seen,
                        "; want exactly one Download then one Synchronize (of ", calls.size(),
                        " calls)");
  }
  if (sum_into != static_cast<size_t>(samples)) {
    return absl::StrCat(sum_into, " loss sums on the device, want one per sample (", samples, ")");
  }
  if (!(last_reduction < waits[0] && waits[0] < first_adamw && last_adamw < waits[1] &&
        waits[1] + 1 == calls.size())) {
    return absl::StrCat("out of order: last reduction @", last_reduction, ", waits at", seen,
                        ", AdamW @", first_adamw, "..", last_adamw, " of ", calls.size());
  }
  return "";
}

struct Layout {
  int world = 1, sp = 1;
  bool fsdp = false;
};

// Trains `steps` steps on rank `rank` of `layout` and checks every step's
// calls.
absl::Status TrainAndCheck(int rank, const Layout& layout, const std::string& tokens,
                           const std::string& rendezvous) {
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = tokens;
  spec.data.seq_len = 64;
  spec.training.steps = 3;
  spec.training.warmup_steps = 1;
  spec.training.grad_accum = 2;
  spec.training.grad_clip = 0.5;  // small enough that clipping happens
  spec.memory.tile_tokens = 16;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.offload = OffloadChoice::kOn;
  spec.parallel.world = layout.world;
  spec.parallel.sp = layout.sp;
  spec.parallel.fsdp = layout.fsdp;
  std::unique_ptr<Comm> comm;
  if (layout.world > 1) {
    RankInfo info;
    info.rank = rank;
    info.world = layout.world;
    info.rendezvous = rendezvous;
    ASSIGN_OR_RETURN(comm, ConnectComm(info, Device::kCpu, /*timeout_s=*/60));
  }
  CpuOps cpu;
  RecordingOps ops(&cpu);
  HostAllocator alloc;
  NodeResources node;  // roomy: the budgets play no part here
  node.host_memory_bytes = int64_t{64} << 30;
  node.ranks_on_host = layout.world;
  ASSIGN_OR_RETURN(ResolvedJob job, ResolveJob(spec, node));
  ASSIGN_OR_RETURN(auto trainer, Trainer::Create(job.spec, &ops, &alloc, comm.get()));
  const int64_t samples = spec.training.grad_accum * spec.data.micro_batch;  // per replica
  std::vector<std::string>& log = ops.log();
  log.clear();  // setup (weights in, working copies out) is not a step
  std::vector<std::string> problems;
  std::vector<double> losses;
  RETURN_IF_ERROR(trainer->Run([&](const StepReport& r) {
    const std::string p = CheckStep(log, samples);
    if (!p.empty()) problems.push_back(absl::StrCat("step ", r.step, ": ", p));
    losses.push_back(r.loss);
    log.clear();
  }));
  RANK_CHECK(losses.size() == 3u, losses.size());
  for (double l : losses) RANK_CHECK(l > 1 && l < 10, "loss ", l);
  RANK_CHECK(problems.empty(), absl::StrJoin(problems, "; "));
  return absl::OkStatus();
}

// Runs the layout's ranks as processes: this test process itself never runs the
// OpenMP CPU kernels, so forking stays safe.
void RunLayout(const std::string& name, const Layout& layout) {
  testing::TempDir dir;
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string tokens = dir.path() + "/corpus.tok";
  ASSERT_TRUE(WriteTokenFile(tokens, ByteTokenize(*text), kByteVocab).ok());
  const std::string rendezvous = dir.rendezvous();
  testing::RunOptions opts;
  opts.wall_limit_s = 120;
  const auto outcomes = testing::RunRanks(
      layout.world, [&](int rank) { return TrainAndCheck(rank, layout, tokens, rendezvous); },
      opts);
  EXPECT_EQ(testing::Failures(outcomes), "") << name;
}

TEST(HostSyncTest, OneRankWithAccumulationAndOffload) { RunLayout("one rank", {1, 1, false}); }

TEST(HostSyncTest, TwoRanksShardedGradients) { RunLayout("fsdp", {2, 1, true}); }

TEST(HostSyncTest, TwoRanksReplicatedGradients) { RunLayout("data parallel", {2, 1, false}); }

TEST(HostSyncTest, TwoRanksUlysses) { RunLayout("ulysses", {2, 2, true}); }

}  // namespace
}  // namespace ithaca
