// cuDNN fused flash attention (SDPA forward and backward: causal, GQA, bf16, f32 LSE) behind a
// small interface, so the heavy cuDNN frontend header is compiled in cudnn_attention.cc alone.
//
// Layouts are the engine's: q, o, do, dq [S, Hq, D]; k, v, dk, dv [S, Hkv, D] (bf16, token
// stride H·D, head stride D); lse f32 [Hq, S] (natural log, scaled logits, as cuDNN's stats).
// One graph per shape is built on first use and cached; the workspace comes from the allocator
// (workspace tier): as large as the largest offered plan's while a new shape's plans are timed,
// then what the chosen plans need.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/memory/allocator.h"

namespace ithaca {
namespace cuda {

struct AttentionShape {
  int64_t s = 0, hq = 0, hkv = 0, d = 0;
  // > 0: each query sees only the `window` latest keys (itself included), a causal band. The
  // memory probe (docs/benchmarks.md) uses it to run million-token steps at linear cost; outputs
  // are then not the model's attention. 0: full causal attention.
  int64_t window = 0;
  // > 0: a packed sample of documents run as a ragged batch (cuDNN's THD layout: [S, H, D] is
  // already the documents' tokens back to back) of `batch` sequences of at most `max_len` tokens,
  // causal within each; the lengths and offsets come as device tensors (RaggedIndex), so one
  // graph serves every layout with the same (batch, max_len) buckets. Unused sequences have
  // length 0. 0: one causal sequence of s tokens.
  int64_t batch = 0, max_len = 0;
  // false: every query sees every key (no causal mask): ring attention's pieces whose keys all
  // come before their queries. Only with window 0 and batch 0.
  bool causal = true;
  // Without the causal mask only: > 0, the keys are that many (s is the queries); 0: s.
  int64_t s_kv = 0;
  // > 0: the LSE's head stride in floats ([H, lse_stride], the first s of each row written);
  // 0: s. A ring piece's visible rectangle of queries is the first rows of its LSE. The forward
  // only: cuDNN's backward before 9.26 refuses stats that are not packed.
  int64_t lse_stride = 0;
};

// The device tensors of a ragged batch (AttentionShape::batch > 0), all in elements.
struct RaggedIndex {
  const int32_t* seq_len = nullptr;       // [batch] tokens of each sequence
  const int64_t* q_offset = nullptr;      // [batch + 1] start of each sequence in q, o, dq, dO
  const int64_t* kv_offset = nullptr;     // [batch + 1] in k, v, dk, dv
  const int64_t* stats_offset = nullptr;  // [batch + 1] in the stats
};

// Settings for measuring cuDNN's plans (attention_bench's --cudnn_* flags); the defaults are what
// training runs.
struct CudnnTuning {
  std::string heuristics = "A";  // heuristic modes offering plans: a comma list of A, B, FALLBACK
  bool verbose = false;          // print every plan's time
  std::string forward_impl;      // the frontend's forward node: "" (its choice), composite, unified
  std::string plans;             // "F,B": plan F forward and B backward, without timing them
  // "ENGINE" or "ENGINE:TYPE=VALUE,..." (as a sweep prints them): that configuration, when it
  // supports the graph.
  std::string config_forward, config_backward;
  int64_t sweep = 0;  // > 0: also every engine's knob combinations, at most this many per engine
};

class CudnnAttention {
 public:
  // `alloc` provides the workspace (Tier::kWorkspace); work is enqueued on `stream`.
  CudnnAttention(cudaStream_t stream, Allocator* alloc, const CudnnTuning& tuning = {});
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // An error when cuDNN has no engine for the shape (the caller may fall back to its own kernel);
  // the error is remembered per shape, so a shape that fails is not rebuilt on every call.
  // A ragged shape needs `ragged`, and its stats are token-major, [S, Hq], not [Hq, S] (cuDNN's
  // packed layout): the caller transposes.
  absl::Status Forward(const AttentionShape& sh, const void* q, const void* k, const void* v,
                       void* o, float* lse, const RaggedIndex* ragged = nullptr);
  absl::Status Backward(const AttentionShape& sh, const void* q, const void* k, const void* v,
                        const void* o, const void* dout, const float* lse, void* dq, void* dk,
                        void* dv, const RaggedIndex* ragged = nullptr);
  // Builds (or looks up) the graphs for a shape without running them.
  absl::Status Prepare(const AttentionShape& sh, bool backward);

  // cuDNN's version at run time (e.g. 91400), for logs.
  static int64_t RuntimeVersion();
  // Bytes of the workspace buffer now held (what the chosen plans of all shapes need).
  int64_t workspace_bytes() const;
  // The workspace each of the shape's plans needs (-1: the plan failed to build). The first call
  // of a shape times every plan that fits the memory left, the largest workspace first.
  absl::StatusOr<std::vector<int64_t>> PlanWorkspaces(const AttentionShape& sh, bool backward);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda
}  // namespace ithaca
