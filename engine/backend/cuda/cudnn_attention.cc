// CudnnAttention: SDPA graphs of NVIDIA's cuDNN frontend, built once per shape and cached.
// The only translation unit that includes <cudnn_frontend.h> (it takes minutes to compile).
//
// The frontend is built in its dynamic-loading mode: cuDNN, NVRTC (for its runtime-compiled
// engines) and the CUDA driver library are dlopen'ed on first use instead of being linked. A
// binary linked against libcuda.so.1 does not even start on a machine without a GPU driver, and
// the GPU tests must start there to skip with a message (CI has no GPU).
#include "engine/backend/cuda/cudnn_attention.h"

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_split.h"

// The handle the frontend's shim resolves every cuDNN symbol through.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace ithaca {
namespace cuda {
namespace {

namespace fe = cudnn_frontend;

// Opens libcudnn once per process; an error names what dlopen said.
absl::Status LoadCudnn() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      fe::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (fe::cudnn_dlhandle) return;
    }
    const char* e = dlerror();
    error = e ? e : "unknown dlopen error";
  });
  if (fe::cudnn_dlhandle) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("cannot load cuDNN: ", error));
}

// Tensor uids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

// Which heuristic modes offer plans: ITHACA_CUDNN_HEUR is a comma list of A, B, FALLBACK
// (default "A"). Every offered plan is timed on the first call, so more modes can only find a
// faster plan, at a one-off cost; the variable exists to measure whether they do.
std::vector<fe::HeurMode_t> HeurModes() {
  const char* env = std::getenv("ITHACA_CUDNN_HEUR");
  const std::string spec = env ? env : "A";
  std::vector<fe::HeurMode_t> modes;
  for (absl::string_view m : absl::StrSplit(spec, ',')) {
    if (m == "A") modes.push_back(fe::HeurMode_t::A);
    if (m == "B") modes.push_back(fe::HeurMode_t::B);
    if (m == "FALLBACK") modes.push_back(fe::HeurMode_t::FALLBACK);
  }
  if (modes.empty()) modes.push_back(fe::HeurMode_t::A);
  return modes;
}

bool Verbose() { return std::getenv("ITHACA_CUDNN_VERBOSE") != nullptr; }

// [S, H, D] seen as cuDNN's [B=1, H, S, D]: the token stride is H·D, the head stride D.
std::shared_ptr<fe::graph::Tensor_attributes> Bshd(fe::graph::Graph& g, const char* name,
                                                   int64_t uid, int64_t s, int64_t h, int64_t d) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, h, s, d})
                      .set_stride({s * h * d, d, h * d, 1}));
}

void SetBshd(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int64_t s,
             int64_t h, int64_t d) {
  t->set_output(true).set_uid(uid).set_dim({1, h, s, d}).set_stride({s * h * d, d, h * d, 1});
}

absl::Status FeError(const char* what, fe::error_t e) {
  return absl::InternalError(absl::StrCat("cuDNN SDPA ", what, ": ", e.get_message()));
}

}  // namespace

struct CudnnAttention::Impl {
  cudaStream_t stream = nullptr;
  Allocator* alloc = nullptr;
  cudnnHandle_t handle = nullptr;
  Buffer workspace;
  struct Entry {
    std::shared_ptr<fe::graph::Graph> graph;
    absl::Status status;
    int64_t workspace = 0;  // the largest over the built plans
    int64_t plans = 0;
    int64_t plan = -1;  // chosen plan; -1 until timed on the first call
  };
  std::map<Key, Entry> graphs;

  absl::StatusOr<Entry*> Get(const AttentionShape& sh, bool backward);
  absl::Status Build(const AttentionShape& sh, bool backward, Entry* e);
  absl::StatusOr<void*> Workspace(int64_t bytes);
  absl::Status Execute(Entry* e, std::unordered_map<int64_t, void*>& pack, const char* what);
};

// cuDNN's heuristic first choice is not always its fastest engine for long causal sequences, so
// every plan the heuristics offer is built, and on the first call of a shape each is timed once
// on the real operands (a one-off cost of a few runs) and the fastest kept.
absl::Status CudnnAttention::Impl::Execute(Entry* e, std::unordered_map<int64_t, void*>& pack,
                                           const char* what) {
  ASSIGN_OR_RETURN(void* ws, Workspace(e->workspace));
  if (e->plan < 0) {
    e->plan = 0;
    float best = 0;
    // ITHACA_CUDNN_PLAN="F,B" forces plan F forward and B backward (indices from an earlier
    // verbose run), which skips the timing: at 512K tokens timing every plan costs a minute.
    const char* forced = std::getenv("ITHACA_CUDNN_PLAN");
    if (forced) {
      std::vector<std::string> f = absl::StrSplit(forced, ',');
      const size_t i = std::string(what) == "forward" ? 0 : 1;
      if (i < f.size() && !f[i].empty()) e->plan = std::min<int64_t>(std::stoll(f[i]), e->plans - 1);
    }
    if (e->plans > 1 && !forced) {
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      for (int64_t i = 0; i < e->plans; ++i) {
        if (e->graph->execute_plan_at_index(handle, pack, ws, i).is_bad()) continue;  // warm-up
        cudaEventRecord(a, stream);
        const bool ok = e->graph->execute_plan_at_index(handle, pack, ws, i).is_good();
        cudaEventRecord(b, stream);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (ok && (best == 0 || ms < best)) {
          best = ms;
          e->plan = i;
        }
        if (Verbose()) {
          std::string name;
          (void)e->graph->get_plan_name_at_index(i, name);
          std::fprintf(stderr, "  cuDNN SDPA %s plan %lld %s: %.3f ms\n", what,
                       static_cast<long long>(i), name.c_str(), ms);
        }
      }
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    if (Verbose()) {
      std::string name;
      (void)e->graph->get_plan_name_at_index(e->plan, name);
      int64_t plan_ws = 0;
      (void)e->graph->get_workspace_size_plan_at_index(e->plan, plan_ws);
      std::fprintf(stderr,
                   "cuDNN %lld SDPA %s: %lld plans, chose %lld (%s, workspace %lld B, %.3f ms)\n",
                   static_cast<long long>(fe::detail::get_backend_version()), what,
                   static_cast<long long>(e->plans), static_cast<long long>(e->plan),
                   name.c_str(), static_cast<long long>(plan_ws), best);
    }
  }
  fe::error_t err = e->graph->execute_plan_at_index(handle, pack, ws, e->plan);
  if (err.is_bad()) return FeError(what, err);
  return absl::OkStatus();
}

absl::Status CudnnAttention::Impl::Build(const AttentionShape& sh, bool backward, Entry* e) {
  const int64_t s = sh.s, hq = sh.hq, hkv = sh.hkv, d = sh.d;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = Bshd(*g, "q", kQ, s, hq, d);
  auto k = Bshd(*g, "k", kK, s, hkv, d);
  auto v = Bshd(*g, "v", kV, s, hkv, d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (!backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa_fwd")
                    .set_generate_stats(true)
                    .set_causal_mask(true)
                    .set_attn_scale(scale);
    if (sh.window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(sh.window));
    auto [o, stats] = g->sdpa(q, k, v, opts);
    SetBshd(o, kO, s, hq, d);
    // cuDNN's stats are [B, H, S, 1]; the engine's LSE is [H, S].
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({1, hq, s, 1})
        .set_stride({hq * s, s, 1, 1});
  } else {
    auto o = Bshd(*g, "o", kO, s, hq, d);
    auto dout = Bshd(*g, "dO", kDO, s, hq, d);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({1, hq, s, 1})
                               .set_stride({hq * s, s, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_bwd")
                    .set_causal_mask(true)
                    .set_attn_scale(scale);
    if (sh.window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(sh.window));
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    SetBshd(dq, kDQ, s, hq, d);
    SetBshd(dk, kDK, s, hkv, d);
    SetBshd(dv, kDV, s, hkv, d);
  }
  fe::error_t err = g->validate();
  if (err.is_bad()) return FeError("validate", err);
  err = g->build_operation_graph(handle);
  if (err.is_bad()) return FeError("build_operation_graph", err);
  err = g->create_execution_plans(HeurModes());
  if (err.is_bad()) return FeError("create_execution_plans", err);
  err = g->check_support(handle);
  if (err.is_bad()) return FeError("check_support", err);
  err = g->build_plans(handle, fe::BuildPlanPolicy_t::ALL);
  if (err.is_bad()) return FeError("build_plans", err);
  e->plans = g->get_execution_plan_count();
  if (e->plans < 1) return absl::InternalError("cuDNN SDPA: no execution plan");
  for (int64_t i = 0; i < e->plans; ++i) {
    int64_t ws = 0;
    err = g->get_workspace_size_plan_at_index(i, ws);
    if (err.is_bad()) return FeError("get_workspace_size", err);
    e->workspace = std::max(e->workspace, ws);
  }
  e->graph = std::move(g);
  return absl::OkStatus();
}

absl::StatusOr<CudnnAttention::Impl::Entry*> CudnnAttention::Impl::Get(const AttentionShape& sh,
                                                                       bool backward) {
  const Key key{sh.s, sh.hq, sh.hkv, sh.d, sh.window, backward};
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    it = graphs.emplace(key, Entry{}).first;
    it->second.status = Build(sh, backward, &it->second);
  }
  if (!it->second.status.ok()) return it->second.status;
  return &it->second;
}

absl::StatusOr<void*> CudnnAttention::Impl::Workspace(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  if (workspace.empty() || static_cast<int64_t>(workspace.tensor().bytes()) < bytes) {
    // Grows only, so a steady state of one shape allocates nothing.
    workspace.Reset();
    ASSIGN_OR_RETURN(workspace,
                     Buffer::Make(alloc, DType::kBF16, {(bytes + 1) / 2}, Tier::kWorkspace));
  }
  return workspace.tensor().data;
}

CudnnAttention::CudnnAttention(cudaStream_t stream, Allocator* alloc) : impl_(new Impl) {
  impl_->stream = stream;
  impl_->alloc = alloc;
}

CudnnAttention::~CudnnAttention() {
  impl_->graphs.clear();
  if (impl_->handle) (void)fe::detail::destroy_handle(impl_->handle);
}

int64_t CudnnAttention::workspace_bytes() const {
  return impl_->workspace.empty() ? 0 : static_cast<int64_t>(impl_->workspace.tensor().bytes());
}

int64_t CudnnAttention::RuntimeVersion() {
  if (!LoadCudnn().ok()) return 0;
  return static_cast<int64_t>(fe::detail::get_backend_version());
}

absl::Status CudnnAttention::Prepare(const AttentionShape& sh, bool backward) {
  if (!impl_->handle) {
    RETURN_IF_ERROR(LoadCudnn());
    if (fe::detail::create_handle(&impl_->handle) != CUDNN_STATUS_SUCCESS) {
      return absl::UnavailableError("cudnnCreate failed");
    }
    if (fe::detail::set_stream(impl_->handle, impl_->stream) != CUDNN_STATUS_SUCCESS) {
      return absl::UnavailableError("cudnnSetStream failed");
    }
  }
  ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(sh, backward));
  (void)e;
  return absl::OkStatus();
}

absl::Status CudnnAttention::Forward(const AttentionShape& sh, const void* q, const void* k,
                                     const void* v, void* o, float* lse) {
  RETURN_IF_ERROR(Prepare(sh, false));
  ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(sh, false));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, o},
                                             {kStats, lse}};
  return impl_->Execute(e, pack, "forward");
}

absl::Status CudnnAttention::Backward(const AttentionShape& sh, const void* q, const void* k,
                                      const void* v, const void* o, const void* dout,
                                      const float* lse, void* dq, void* dk, void* dv) {
  RETURN_IF_ERROR(Prepare(sh, true));
  ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(sh, true));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, const_cast<void*>(o)},
                                             {kDO, const_cast<void*>(dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, dq},
                                             {kDK, dk},
                                             {kDV, dv}};
  return impl_->Execute(e, pack, "backward");
}

}  // namespace cuda
}  // namespace ithaca
