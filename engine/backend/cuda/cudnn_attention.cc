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

#include "absl/strings/str_cat.h"
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
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqLenQ,
  kSeqLenKv,
  kQOffset,
  kKvOffset,
  kStatsOffset
};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, int64_t, bool,
                       int64_t, int64_t>;

// The heuristic modes that offer plans (CudnnTuning::heuristics). Every offered plan is timed on
// the first call, so more modes can only find a faster plan, at a one-off cost.
std::vector<fe::HeurMode_t> HeurModes(const CudnnTuning& t) {
  std::vector<fe::HeurMode_t> modes;
  for (absl::string_view m : absl::StrSplit(t.heuristics, ',')) {
    if (m == "A") modes.push_back(fe::HeurMode_t::A);
    if (m == "B") modes.push_back(fe::HeurMode_t::B);
    if (m == "FALLBACK") modes.push_back(fe::HeurMode_t::FALLBACK);
  }
  if (modes.empty()) modes.push_back(fe::HeurMode_t::A);
  return modes;
}

// The frontend's forward node (CudnnTuning::forward_impl; default: its own choice, UNIFIED from
// cuDNN 9.13.1 on); the backward has only the composite one.
fe::AttentionImplementation_t ForwardImplementation(const CudnnTuning& t) {
  if (t.forward_impl == "composite") return fe::AttentionImplementation_t::COMPOSITE;
  if (t.forward_impl == "unified") return fe::AttentionImplementation_t::UNIFIED;
  return fe::AttentionImplementation_t::AUTO;
}

// An engine configuration: a global engine id and its knob choices (frontend knob numbers).
struct EngineConfig {
  int64_t engine = -1;
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
};

// "ENGINE" or "ENGINE:TYPE=VALUE,TYPE=VALUE" (as the sweep prints them); engine −1 when unset.
EngineConfig ParseConfig(const std::string& spec) {
  EngineConfig c;
  if (spec.empty()) return c;
  std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  c.engine = std::stoll(parts[0]);
  if (parts.size() > 1) {
    for (absl::string_view kv : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
      std::vector<std::string> t = absl::StrSplit(kv, '=');
      if (t.size() == 2) c.knobs[static_cast<fe::KnobType_t>(std::stoll(t[0]))] = std::stoll(t[1]);
    }
  }
  return c;
}

std::string FormatConfig(const EngineConfig& c) {
  std::vector<std::pair<int64_t, int64_t>> kv;
  for (const auto& [type, value] : c.knobs) kv.emplace_back(static_cast<int64_t>(type), value);
  std::sort(kv.begin(), kv.end());
  std::string s = std::to_string(c.engine);
  for (size_t i = 0; i < kv.size(); ++i) {
    absl::StrAppend(&s, i == 0 ? ":" : ",", kv[i].first, "=", kv[i].second);
  }
  return s;
}

// Every knob combination of every engine that accepts the graph, the first `per_engine` of each
// (in odometer order). Enqueued as plans next to the heuristics' own, so the first-call timing
// measures them all (combinations an engine rejects fail to build and are skipped).
void EnqueueSweep(fe::graph::Graph& g, int64_t per_engine, bool verbose) {
  int64_t engines = 0;
  if (g.get_engine_count(engines).is_bad()) return;
  for (int64_t eng = 0; eng < engines; ++eng) {
    std::vector<fe::Knob> knobs;
    if (g.get_knobs_for_engine(eng, knobs).is_bad()) continue;
    std::vector<std::pair<fe::KnobType_t, std::vector<int64_t>>> axes;
    for (const fe::Knob& k : knobs) {
      std::vector<int64_t> values;
      const int64_t stride = std::max<int64_t>(1, k.stride);
      for (int64_t v = k.minValue; v <= k.maxValue && values.size() < 4096; v += stride) {
        values.push_back(v);
      }
      if (!values.empty()) axes.emplace_back(k.type, values);
    }
    if (verbose) {
      std::string desc;
      for (const auto& [type, values] : axes) {
        absl::StrAppend(&desc, " knob ", static_cast<int64_t>(type), " [", values.front(), "..",
                        values.back(), "] (", values.size(), " values)");
      }
      std::fprintf(stderr, "cuDNN SDPA sweep: engine %lld:%s\n", static_cast<long long>(eng),
                   desc.c_str());
    }
    std::vector<size_t> idx(axes.size(), 0);
    for (int64_t n = 0; n < per_engine; ++n) {
      std::unordered_map<fe::KnobType_t, int64_t> choice;
      for (size_t a = 0; a < axes.size(); ++a) choice[axes[a].first] = axes[a].second[idx[a]];
      (void)g.create_execution_plan(eng, choice);  // unsupported combinations fail to build
      size_t a = 0;                                // odometer over the axes
      while (a < axes.size() && ++idx[a] == axes[a].second.size()) idx[a++] = 0;
      if (a == axes.size()) break;
    }
  }
}

// The index tensors of a ragged batch (AttentionShape::batch > 0).
struct RaggedTensors {
  // Equal lengths, two tensors (one per role, as the frontend's own tests build them).
  std::shared_ptr<fe::graph::Tensor_attributes> seq_len_q, seq_len_kv;
  std::shared_ptr<fe::graph::Tensor_attributes> q_offset, kv_offset, stats_offset;
};

RaggedTensors MakeRagged(fe::graph::Graph& g, int64_t batch) {
  auto index = [&](const char* name, int64_t uid, int64_t n, fe::DataType_t t) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(t));
  };
  RaggedTensors r;
  r.seq_len_q = index("seq_len_q", kSeqLenQ, batch, fe::DataType_t::INT32);
  r.seq_len_kv = index("seq_len_kv", kSeqLenKv, batch, fe::DataType_t::INT32);
  r.q_offset = index("q_offset", kQOffset, batch + 1, fe::DataType_t::INT64);
  r.kv_offset = index("kv_offset", kKvOffset, batch + 1, fe::DataType_t::INT64);
  r.stats_offset = index("stats_offset", kStatsOffset, batch + 1, fe::DataType_t::INT64);
  return r;
}

// q, k, v, o and their gradients as cuDNN tensors: [S, H, D] is [1, H, S, D] with token stride
// H·D; a ragged batch is [B, H, max_len, D] with the same strides inside each sequence and the
// sequences placed by the offset tensors.
struct Layout {
  int64_t b, s;
  std::shared_ptr<fe::graph::Tensor_attributes> Make(fe::graph::Graph& g, const char* name,
                                                     int64_t uid, int64_t h, int64_t d) const {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({b, h, s, d})
                        .set_stride({s * h * d, d, h * d, 1}));
  }
  void Set(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int64_t h,
           int64_t d) const {
    t->set_output(true).set_uid(uid).set_dim({b, h, s, d}).set_stride({s * h * d, d, h * d, 1});
  }
  // cuDNN's stats: [B, H, S, 1], head-major for one sequence (rows `stride` apart, s when 0),
  // token-major when ragged.
  void SetStats(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t h, bool ragged,
                int64_t stride = 0) const {
    const int64_t row = stride > 0 ? stride : s;
    t->set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({b, h, s, 1})
        .set_stride(ragged ? std::vector<int64_t>{h * s, 1, h, 1}
                           : std::vector<int64_t>{h * row, row, 1, 1});
  }
};

absl::Status FeError(const char* what, fe::error_t e) {
  return absl::InternalError(absl::StrCat("cuDNN SDPA ", what, ": ", e.get_message()));
}

}  // namespace

struct CudnnAttention::Impl {
  CudnnTuning tuning;
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
  // `allow_forced`: honour CudnnTuning's configurations (false on the retry without them).
  absl::Status Build(const AttentionShape& sh, bool backward, Entry* e, bool allow_forced = true);
  absl::StatusOr<void*> Workspace(int64_t bytes);
  absl::Status Execute(Entry* e, std::unordered_map<int64_t, void*>& pack, const char* what);
};

// cuDNN's heuristic first choice is not always its fastest engine for long causal sequences, so
// every plan the heuristics offer is built, and on the first call of a shape each is timed once
// on the real operands (a one-off cost of a few runs) and the fastest kept.
absl::Status CudnnAttention::Impl::Execute(Entry* e, std::unordered_map<int64_t, void*>& pack,
                                           const char* what) {
  // Timing every plan needs the largest one's workspace, a one-off the planner does not budget
  // (it budgets the chosen plan's). Where memory is too tight for it, time the plans whose
  // workspace fits, trying the sizes from the largest down, rather than fail the first step.
  int64_t timing_limit = e->workspace;
  absl::StatusOr<void*> got = Workspace(e->workspace);
  if (!got.ok() && e->plan < 0 && absl::IsResourceExhausted(got.status())) {
    std::vector<int64_t> sizes;
    for (int64_t i = 0; i < e->plans; ++i) {
      int64_t w = 0;
      if (e->graph->get_workspace_size_plan_at_index(i, w).is_good() && w < e->workspace)
        sizes.push_back(w);
    }
    std::sort(sizes.rbegin(), sizes.rend());
    for (int64_t w : sizes) {
      absl::StatusOr<void*> smaller = Workspace(w);
      if (smaller.ok()) {
        got = smaller;
        timing_limit = w;
        break;
      }
    }
    if (got.ok() && tuning.verbose) {
      std::fprintf(stderr, "  cuDNN SDPA %s: timing only plans with at most %lld B of workspace\n",
                   what, static_cast<long long>(timing_limit));
    }
  }
  RETURN_IF_ERROR(got.status());
  void* ws = *got;
  if (e->plan < 0) {
    e->plan = 0;
    float best = 0;
    // CudnnTuning::plans = "F,B" forces plan F forward and B backward (indices from an earlier
    // verbose run), which skips the timing: at 512K tokens timing every plan costs a minute.
    const bool forced = !tuning.plans.empty();
    if (forced) {
      std::vector<std::string> f = absl::StrSplit(tuning.plans, ',');
      const size_t i = std::string(what) == "forward" ? 0 : 1;
      if (i < f.size() && !f[i].empty())
        e->plan = std::min<int64_t>(std::stoll(f[i]), e->plans - 1);
    }
    if (e->plans > 1 && !forced) {
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      for (int64_t i = 0; i < e->plans; ++i) {
        int64_t plan_ws = 0;
        if (e->graph->get_workspace_size_plan_at_index(i, plan_ws).is_bad() ||
            plan_ws > timing_limit) {
          continue;  // failed to build (a sweep's unsupported combination), or too large to fit
        }
        if (e->graph->execute_plan_at_index(handle, pack, ws, i).is_bad()) {  // warm-up
          continue;  // a plan that failed to build (a sweep's unsupported combination)
        }
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
        if (tuning.verbose) {
          std::string name;
          (void)e->graph->get_plan_name_at_index(i, name);
          EngineConfig c;
          (void)e->graph->get_engine_and_knobs_at_index(i, c.engine, c.knobs);
          std::fprintf(stderr, "  cuDNN SDPA %s plan %lld %s (config %s): %.3f ms\n", what,
                       static_cast<long long>(i), name.c_str(), FormatConfig(c).c_str(), ms);
        }
      }
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    // Timing needed the largest offered plan's workspace; from now on this shape needs only
    // its chosen plan's, and the buffer shrinks to what the chosen plans of all shapes need.
    int64_t chosen_ws = 0;
    if (e->graph->get_workspace_size_plan_at_index(e->plan, chosen_ws).is_good()) {
      e->workspace = chosen_ws;
      int64_t need = 0;
      for (const auto& [key, other] : graphs) need = std::max(need, other.workspace);
      if (!workspace.empty() && static_cast<int64_t>(workspace.tensor().bytes()) > need) {
        workspace.ResetUncached();
      }
      ASSIGN_OR_RETURN(ws, Workspace(e->workspace));
    }
    if (tuning.verbose) {
      std::string name;
      (void)e->graph->get_plan_name_at_index(e->plan, name);
      int64_t plan_ws = 0;
      (void)e->graph->get_workspace_size_plan_at_index(e->plan, plan_ws);
      EngineConfig c;
      (void)e->graph->get_engine_and_knobs_at_index(e->plan, c.engine, c.knobs);
      std::fprintf(stderr,
                   "cuDNN %lld SDPA %s: %lld plans, chose %lld (%s, config %s, workspace %lld B, "
                   "%.3f ms)\n",
                   static_cast<long long>(fe::detail::get_backend_version()), what,
                   static_cast<long long>(e->plans), static_cast<long long>(e->plan), name.c_str(),
                   FormatConfig(c).c_str(), static_cast<long long>(plan_ws), best);
    }
  }
  fe::error_t err = e->graph->execute_plan_at_index(handle, pack, ws, e->plan);
  if (err.is_bad()) return FeError(what, err);
  return absl::OkStatus();
}

absl::Status CudnnAttention::Impl::Build(const AttentionShape& sh, bool backward, Entry* e,
                                         bool allow_forced) {
  const int64_t s = sh.s, hq = sh.hq, hkv = sh.hkv, d = sh.d;
  if (!sh.causal && (sh.window > 0 || sh.batch > 0)) {
    return absl::InvalidArgumentError(
        "cuDNN SDPA: attention without the causal mask takes no window and no documents");
  }
  if ((sh.causal || sh.batch > 0) && ((sh.s_kv > 0 && sh.s_kv != s) || sh.lse_stride > 0)) {
    return absl::InvalidArgumentError(
        "cuDNN SDPA: keys of another length and a strided LSE only without the causal mask");
  }
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const bool ragged = sh.batch > 0;
  const Layout lay = ragged ? Layout{sh.batch, sh.max_len} : Layout{1, s};
  const Layout kv_lay = sh.s_kv > 0 ? Layout{1, sh.s_kv} : lay;  // the keys
  RaggedTensors r;
  if (ragged) r = MakeRagged(*g, sh.batch);
  // Sequence i of a ragged tensor starts at element offset[i] of its buffer.
  auto place = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t,
                   const std::shared_ptr<fe::graph::Tensor_attributes>& offset) {
    if (ragged) t->set_ragged_offset(offset);
  };
  auto q = lay.Make(*g, "q", kQ, hq, d);
  auto k = kv_lay.Make(*g, "k", kK, hkv, d);
  auto v = kv_lay.Make(*g, "v", kV, hkv, d);
  place(q, r.q_offset);
  place(k, r.kv_offset);
  place(v, r.kv_offset);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // Padding mask: sequence i has seq_len[i] queries and keys; causal is then per sequence. (The
  // forward and backward attributes are different types with the same setters.)
  auto set_padding = [&](auto& opts) {
    opts.set_padding_mask(true)
        .set_seq_len_q(r.seq_len_q)
        .set_seq_len_kv(r.seq_len_kv)
        .set_max_total_seq_len_q(s)
        .set_max_total_seq_len_kv(s);
  };
  if (!backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa_fwd")
                    .set_generate_stats(true)
                    .set_causal_mask(sh.causal)
                    .set_attn_scale(scale)
                    .set_implementation(ForwardImplementation(tuning));
    if (sh.window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(sh.window));
    if (ragged) set_padding(opts);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    lay.Set(o, kO, hq, d);
    place(o, r.q_offset);
    // The engine's LSE is [H, S]: exactly cuDNN's stats for one sequence.
    stats->set_output(true);
    lay.SetStats(stats, hq, ragged, sh.lse_stride);
    place(stats, r.stats_offset);
  } else {
    auto o = lay.Make(*g, "o", kO, hq, d);
    auto dout = lay.Make(*g, "dO", kDO, hq, d);
    place(o, r.q_offset);
    place(dout, r.q_offset);
    auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats"));
    lay.SetStats(stats, hq, ragged, sh.lse_stride);
    place(stats, r.stats_offset);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_bwd")
                    .set_causal_mask(sh.causal)
                    .set_attn_scale(scale);
    if (sh.window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(sh.window));
    if (ragged) set_padding(opts);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    lay.Set(dq, kDQ, hq, d);
    kv_lay.Set(dk, kDK, hkv, d);
    kv_lay.Set(dv, kDV, hkv, d);
    place(dq, r.q_offset);
    place(dk, r.kv_offset);
    place(dv, r.kv_offset);
  }
  fe::error_t err = g->validate();
  if (err.is_bad()) return FeError("validate", err);
  err = g->build_operation_graph(handle);
  if (err.is_bad()) return FeError("build_operation_graph", err);
  // Plans: the configuration CudnnTuning names (from a sweep) when it builds, else the
  // heuristics' offers, plus with CudnnTuning::sweep = N every engine's knob combinations (≤ N
  // per engine); the first call times them all and keeps the fastest.
  const EngineConfig forced =
      allow_forced ? ParseConfig(backward ? tuning.config_backward : tuning.config_forward)
                   : EngineConfig{};
  bool planned = false;
  if (forced.engine >= 0) {
    planned = g->create_execution_plan(forced.engine, forced.knobs).is_good() &&
              g->check_support().is_good();
    if (!planned) {
      std::fprintf(stderr,
                   "cuDNN SDPA: configuration %s does not support the graph; using "
                   "the heuristics\n",
                   FormatConfig(forced).c_str());
      g = nullptr;
      return Build(sh, backward, e, /*allow_forced=*/false);
    }
  }
  if (!planned) {
    err = g->create_execution_plans(HeurModes(tuning));
    if (err.is_bad()) return FeError("create_execution_plans", err);
    if (tuning.sweep > 0) EnqueueSweep(*g, tuning.sweep, tuning.verbose);
    err = g->check_support();
    if (err.is_bad()) return FeError("check_support", err);
  }
  err = g->build_plans(fe::BuildPlanPolicy_t::ALL);
  if (err.is_bad()) return FeError("build_plans", err);
  e->plans = g->get_execution_plan_count();
  if (e->plans < 1) return absl::InternalError("cuDNN SDPA: no execution plan");
  for (int64_t i = 0; i < e->plans; ++i) {
    int64_t ws = 0;
    // A plan that failed to build has no size; it is skipped when timing.
    if (g->get_workspace_size_plan_at_index(i, ws).is_good())
      e->workspace = std::max(e->workspace, ws);
  }
  e->graph = std::move(g);
  return absl::OkStatus();
}

absl::StatusOr<CudnnAttention::Impl::Entry*> CudnnAttention::Impl::Get(const AttentionShape& sh,
                                                                       bool backward) {
  const Key key{sh.s,     sh.hq,      sh.hkv,    sh.d,    sh.window,    backward,
                sh.batch, sh.max_len, sh.causal, sh.s_kv, sh.lse_stride};
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
    // Grows only (Execute shrinks it once per shape), so steady state allocates nothing. The
    // sizes are one-offs (a shape's largest plan while timing, then its chosen plan's), so the
    // old block goes back to CUDA rather than into the allocator's cache, where no later request
    // would reuse it and the process would hold it to the end.
    workspace.ResetUncached();
    ASSIGN_OR_RETURN(workspace,
                     Buffer::Make(alloc, DType::kBF16, {(bytes + 1) / 2}, Tier::kWorkspace));
  }
  return workspace.tensor().data;
}

CudnnAttention::CudnnAttention(cudaStream_t stream, Allocator* alloc, const CudnnTuning& tuning)
    : impl_(new Impl) {
  impl_->tuning = tuning;
  impl_->stream = stream;
  impl_->alloc = alloc;
}

CudnnAttention::~CudnnAttention() {
  impl_->graphs.clear();
  if (impl_->handle) (void)fe::detail::destroy_handle(impl_->handle);
}

absl::StatusOr<std::vector<int64_t>> CudnnAttention::PlanWorkspaces(const AttentionShape& sh,
                                                                    bool backward) {
  RETURN_IF_ERROR(Prepare(sh, backward));
  ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(sh, backward));
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < e->plans; ++i) {
    int64_t w = 0;
    sizes.push_back(e->graph->get_workspace_size_plan_at_index(i, w).is_good() ? w : -1);
  }
  return sizes;
}

int64_t CudnnAttention::workspace_bytes() const {
  return impl_->workspace.empty() ? 0 : static_cast<int64_t>(impl_->workspace.tensor().bytes());
}

int64_t CudnnAttention::RuntimeVersion() {
  if (!LoadCudnn().ok()) return 0;
  return static_cast<int64_t>(fe::detail::get_backend_version());
}

namespace {

absl::Status AddRagged(const AttentionShape& sh, const RaggedIndex* ragged,
                       std::unordered_map<int64_t, void*>& pack) {
  if (sh.batch == 0) return absl::OkStatus();
  if (!ragged || !ragged->seq_len || !ragged->q_offset || !ragged->kv_offset ||
      !ragged->stats_offset) {
    return absl::InvalidArgumentError("cuDNN SDPA: a ragged shape needs its index tensors");
  }
  pack[kSeqLenQ] = const_cast<int32_t*>(ragged->seq_len);
  pack[kSeqLenKv] = const_cast<int32_t*>(ragged->seq_len);
  pack[kQOffset] = const_cast<int64_t*>(ragged->q_offset);
  pack[kKvOffset] = const_cast<int64_t*>(ragged->kv_offset);
  pack[kStatsOffset] = const_cast<int64_t*>(ragged->stats_offset);
  return absl::OkStatus();
}

}  // namespace

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
                                     const void* v, void* o, float* lse,
                                     const RaggedIndex* ragged) {
  RETURN_IF_ERROR(Prepare(sh, false));
  ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(sh, false));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, o},
                                             {kStats, lse}};
  RETURN_IF_ERROR(AddRagged(sh, ragged, pack));
  return impl_->Execute(e, pack, "forward");
}

absl::Status CudnnAttention::Backward(const AttentionShape& sh, const void* q, const void* k,
                                      const void* v, const void* o, const void* dout,
                                      const float* lse, void* dq, void* dk, void* dv,
                                      const RaggedIndex* ragged) {
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
  RETURN_IF_ERROR(AddRagged(sh, ragged, pack));
  return impl_->Execute(e, pack, "backward");
}

}  // namespace cuda
}  // namespace ithaca
