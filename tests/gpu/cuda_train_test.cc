// 20 training steps of the tiny model on the GPU (Trainer + CudaOps + CudaAllocator, bf16), plain
// and with UPipe + attention-aware recompute + offload, track
// the CPU backend's (f32) loss curve step by step; so do tiny Qwen3 (q/k norms, yarn RoPE) and
// Qwen2 (q/k/v biases) models and a Mistral with a sliding window (on cuDNN's causal band).
#include <cmath>
#include <cstdio>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "engine/plan/resolve.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

JobSpec TinySpec() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/cuda_train";
  EXPECT_TRUE(MakeDirs(dir).ok());
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = dir + "/corpus.tok";
  EXPECT_TRUE(WriteTokenFile(spec.data.path, ByteTokenize(*text), kByteVocab).ok());
  spec.data.seq_len = 100;  // not a multiple of any kernel tile
  spec.training.steps = 20;
  spec.training.lr = 3e-3;
  spec.training.min_lr = 3e-4;
  spec.training.warmup_steps = 3;
  spec.memory.tile_tokens = 24;
  spec.memory.recompute = RecomputePolicy::kFull;  // the plain schedule unless a test says
  return spec;
}

// The spec as admission would resolve it for `backend` on a roomy node.
JobSpec Resolved(JobSpec spec, const std::string& backend) {
  spec.backend = backend;
  NodeResources node;
  node.device_memory_bytes = int64_t{80} << 30;
  node.host_memory_bytes = int64_t{64} << 30;
  absl::StatusOr<ResolvedJob> job = ResolveJob(spec, node);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->spec : spec;
}

std::vector<double> Losses(Trainer& t) {
  std::vector<double> losses;
  absl::Status st = t.Run([&](const StepReport& r) { losses.push_back(r.loss); });
  EXPECT_TRUE(st.ok()) << st;
  return losses;
}

// Trains the tiny model with `gpu_spec` on the GPU and checks its loss curve against the CPU
// backend's (f32, plain: full recompute, all heads in one stage, no offload).
// `min_drop`: how much lower the last step's loss is than the first's.
void ExpectGpuTracksCpu(const JobSpec& gpu_spec, JobSpec cpu_spec = TinySpec(),
                        double min_drop = 1.0) {
  CpuOps cpu;
  HostAllocator host_alloc;
  auto tc = Trainer::Create(Resolved(cpu_spec, "cpu"), &cpu, &host_alloc);
  ASSERT_TRUE(tc.ok()) << tc.status();
  const std::vector<double> want = Losses(**tc);

  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  CudaOps ops(o);
  auto tg = Trainer::Create(Resolved(gpu_spec, "cuda"), &ops, &alloc);
  ASSERT_TRUE(tg.ok()) << tg.status();
  const int64_t mallocs_before = alloc.stats().device_mallocs;
  const std::vector<double> got = Losses(**tg);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double rel = std::fabs(got[i] - want[i]) / want[i];
    worst = std::max(worst, rel);
    std::printf("  step %2zu  cpu %.4f  cuda %.4f  rel %.2e\n", i + 1, want[i], got[i], rel);
  }
  std::printf(
      "  worst relative loss difference %.3e; attention ran on %s; %lld cudaMalloc "
      "calls during 20 steps\n",
      worst, ops.last_attention_impl(),
      static_cast<long long>(alloc.stats().device_mallocs - mallocs_before));
  EXPECT_LT(worst, 0.03) << "the bf16 GPU run must track the f32 CPU run within a few percent";
  EXPECT_LT(got.back(), got.front() - min_drop) << "and learn";
}

TEST(CudaTrainTest, TinyModelTracksCpuLossCurve) {
  SKIP_WITHOUT_GPU();
  ExpectGpuTracksCpu(TinySpec());
}

// The long-context settings together on the GPU: UPipe stages of one query head (4 stages over
// 2 K/V rounds), attention-aware recompute (O and LSE kept, attention never re-run) and the
// saved block data offloaded to pinned host memory between forward and backward.
TEST(CudaTrainTest, UPipeAttentionAwareOffloadTracksCpuLossCurve) {
  SKIP_WITHOUT_GPU();
  JobSpec spec = TinySpec();
  spec.memory.recompute = RecomputePolicy::kAttentionAware;
  spec.memory.head_chunk = 1;
  spec.memory.offload = OffloadChoice::kOn;
  ExpectGpuTracksCpu(spec);
}

// LoRA (issue 52): adapters on all seven targets over the frozen base, the base's weight
// gradients skipped, on the GPU as on the CPU: the same losses within the bf16 bar, in the plain
// schedule and in UPipe stages with attention-aware recompute and offload.
TEST(CudaTrainTest, LoraTracksCpuLossCurve) {
  SKIP_WITHOUT_GPU();
  JobSpec spec = TinySpec();
  spec.lora.rank = 8;
  spec.lora.alpha = 16;
  spec.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  ExpectGpuTracksCpu(spec, spec, /*min_drop=*/0.1);
  JobSpec upipe = spec;
  upipe.memory.recompute = RecomputePolicy::kAttentionAware;
  upipe.memory.head_chunk = 1;
  upipe.memory.offload = OffloadChoice::kOn;
  ExpectGpuTracksCpu(upipe, spec, /*min_drop=*/0.1);
}

// The tiny model as another family, written to a config.json the specs name.
JobSpec FamilySpec(const std::string& family) {
  JobSpec spec = TinySpec();
  LlamaConfig cfg = *PresetConfig("tiny");
  if (family == "qwen3") {
    cfg.family = ModelFamily::kQwen3;
    cfg.qk_norm = true;
    cfg.head_dim = cfg.rope.head_dim = 24;  // not hidden / heads
    cfg.rope.type = RopeType::kYarn;
    cfg.rope.factor = 4;
    cfg.rope.original_max_position = 32;
    cfg.rope.attention_factor = 0.1 * std::log(4.0) + 1.0;
  } else if (family == "qwen2" || family == "qwen2-window-layers") {
    cfg.family = ModelFamily::kQwen2;
    cfg.qkv_bias = true;
    if (family == "qwen2-window-layers") {  // use_sliding_window from max_window_layers 1
      cfg.sliding_window = 16;
      cfg.window_first_layer = 1;
    }
  } else {
    cfg.family = ModelFamily::kMistral;
    cfg.sliding_window = 16;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  spec.model.config = std::string(tmp ? tmp : "/tmp") + "/cuda_train/" + family + ".json";
  EXPECT_TRUE(WriteFileAtomic(spec.model.config, ConfigToJson(cfg)).ok());
  return spec;
}

TEST(CudaTrainTest, TinyQwen3WithYarnTracksCpuLossCurve) {
  SKIP_WITHOUT_GPU();
  JobSpec spec = FamilySpec("qwen3");
  ExpectGpuTracksCpu(spec, spec);
  spec.memory.recompute = RecomputePolicy::kAttentionAware;
  spec.memory.head_chunk = 1;
  ExpectGpuTracksCpu(spec, FamilySpec("qwen3"));
}

TEST(CudaTrainTest, TinyQwen2TracksCpuLossCurve) {
  SKIP_WITHOUT_GPU();
  JobSpec spec = FamilySpec("qwen2");
  ExpectGpuTracksCpu(spec, spec);
}

// Qwen2's use_sliding_window: a window of 16 keys on the last layer, the first full causal.
TEST(CudaTrainTest, TinyQwen2WithWindowLayersTracksCpuLossCurve) {
  SKIP_WITHOUT_GPU();
  JobSpec spec = FamilySpec("qwen2-window-layers");
  ExpectGpuTracksCpu(spec, spec);
}

// A window of 16 keys over samples of 100 tokens: cuDNN's band, against the CPU attention's.
TEST(CudaTrainTest, TinyMistralWithWindowTracksCpuLossCurve) {
  SKIP_WITHOUT_GPU();
  JobSpec spec = FamilySpec("mistral");
  ExpectGpuTracksCpu(spec, spec);
}

}  // namespace
}  // namespace ithaca
