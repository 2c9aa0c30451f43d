// The step-time model: what one training step of a plan will take, predicted without a GPU.
//
// The planner's meta replay (meta.h) already walks every op of one step in the order the engine
// issues it. With a RateTable and a StepClock attached, each op also gets a predicted time from
// measured rates of the device class (GEMMs by shape, attention by head_dim and length,
// elementwise ops by bytes, host<->device copies, collectives from the rehearsal's link model)
// and is placed on the stream the engine runs it on: compute, copy (CopyAsync: offload,
// prefetch, parameter uploads) or comm (collectives). The clock keeps each stream's time and
// the waits between them the way the engine orders them (WaitFence, Issued::Wait, a blocking
// collective), so overlap is modeled, not assumed. docs/schedules.md ("The step-time model")
// says where the model is wrong.
//
// A RateTable is data: `bench/calibrate` measures one on the device class and writes it as
// text (engine/plan/rates/<name>.txt, compiled in). Lookups never fail: a shape the table lacks
// takes its nearest measured neighbour's rate.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace ithaca {

// One GEMM shape as Ops::Gemm sees it: c [m, n] = op(a) [m, k] · op(b) [k, n].
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  bool c_f32 = false;  // an f32 output (gradient accumulation), else the activation dtype
  bool operator<(const GemmShape& o) const;
  bool operator==(const GemmShape& o) const;
  struct Hash {
    size_t operator()(const GemmShape& g) const;
  };
};

struct GemmRate {
  GemmShape shape;
  double seconds = 0;
};

// Attention of `pass` at head_dim `head_dim` over a causal sample of `seq` tokens with `heads`
// query heads (a quarter of them K/V heads), in FLOP/s of the attention computed
// (AttentionFlops).
struct AttentionRate {
  bool backward = false;
  int64_t head_dim = 0;
  int64_t heads = 0;
  int64_t seq = 0;
  double flops_per_s = 0;
};

// An elementwise op: time = launch_s + bytes / bytes_per_s, bytes as OpBytes counts them.
struct OpRate {
  double bytes_per_s = 0;
  double launch_s = 0;
};

struct RateTable {
  std::string device;  // the device class: "h200", "cpu"
  std::string note;    // where and when it was measured
  std::vector<GemmRate> gemms;
  std::vector<AttentionRate> attention;
  std::map<std::string, OpRate> ops;                // by ElementwiseOp name
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;  // pinned host memory, the copy stream
  double host_adamw_params_per_s = 0;               // the CPU AdamW of optimizer offload
  double gemm_flops_per_s = 0;                      // for a table without GEMM shapes
};

// The text form (one record per line, '#' comments): what bench/calibrate writes.
//   device NAME / note TEXT
//   gemm M N K TA TB C_F32 SECONDS
//   attention fwd|bwd HEAD_DIM HEADS SEQ FLOPS_PER_S
//   op NAME BYTES_PER_S LAUNCH_S
//   h2d BYTES_PER_S / d2h BYTES_PER_S / host_adamw PARAMS_PER_S / gemm_flops FLOPS_PER_S
absl::StatusOr<RateTable> ParseRateTable(const std::string& text);
std::string RateTableText(const RateTable& table);

// The tables committed under engine/plan/rates/: "h100" and "h200" (one GPU of the class,
// bench/calibrate) and "cpu".
absl::StatusOr<RateTable> BuiltinRateTable(const std::string& name);
std::vector<std::string> BuiltinRateTableNames();
// The one rule for which table a plan uses: on CUDA the class its GPUs' name says ("NVIDIA
// H100 80GB HBM3" as nvidia-smi names it, "h100x8" as `ithaca plan --hardware` does: "h100"),
// "h200" for any other GPU or none named (the first class calibrated); "cpu" on the CPU.
std::string RateTableNameFor(Device device, const std::string& gpu_name);
const RateTable& DefaultRateTable(Device device, const std::string& gpu_name = "");

// The elementwise ops the model times by bytes (names in the table).
enum class ElementwiseOp {
  kFill,
  kCopy,
  kAxpy,
  kReduce,
  kEmbedding,
  kEmbeddingBackward,
  kRmsNorm,
  kRmsNormBackward,
  kRope,
  kSwiGLU,
  kSwiGLUBackward,
  kCrossEntropy,
  kAdamW,
  kNumOps
};
const char* ElementwiseOpName(ElementwiseOp op);

// The attention's "pairs" of one head over a sample of `seq` tokens whose documents start at
// `doc_starts` (empty: one document), each query counting the keys it sees twice (so a causal
// document of n tokens counts n²: the model-FLOPs convention of ModelFlopsPerSample), under a
// sliding `window` (0: none).
double AttentionPairs(int64_t seq, int64_t window, const std::vector<int64_t>& doc_starts);
// The same count for one chunk of ring attention: queries at [q_pos0, q_pos0 + sq) against keys
// at [k_pos0, k_pos0 + sk) (Ops::AttentionChunk), each visible pair counted twice as above.
// Exact up to 4,096 queries, else summed over 1,024 evenly spaced queries (the count is
// piecewise linear in the query's position).
double AttentionChunkPairs(int64_t sq, int64_t sk, int64_t q_pos0, int64_t k_pos0, int64_t window,
                           const std::vector<int64_t>& doc_starts);
// FLOPs of one attention pass over `heads` query heads of head_dim `head_dim`: 2·pairs·H·D
// forward, 4·pairs·H·D backward.
double AttentionFlops(bool backward, double pairs, int64_t heads, int64_t head_dim);

double GemmSeconds(const RateTable& t, const GemmShape& g);
// `seq` tokens, `pairs` as AttentionPairs counts them for the call's mask.
double AttentionSeconds(const RateTable& t, bool backward, int64_t seq, double pairs, int64_t heads,
                        int64_t head_dim);
double ElementwiseSeconds(const RateTable& t, ElementwiseOp op, int64_t bytes);
// The rate ElementwiseSeconds prices `op` at (the table's "copy" where it has no row for it;
// zero where it has neither), and the seconds of `bytes` at such a rate: a caller pricing many
// ops looks each rate up once.
OpRate ElementwiseRate(const RateTable& t, ElementwiseOp op);
double ElementwiseSeconds(const OpRate& rate, int64_t bytes);
double TransferSeconds(const RateTable& t, bool to_device, int64_t bytes);

// One thing the meta device did (engine/plan/meta.h): an allocation or a free of MetaAllocator,
// or a call of StepClock. A BlockTapes (block_tape.h) records a block's events once and replays
// identical blocks from the record.
struct MetaEvent {
  enum class Kind : uint8_t {
    kAllocate,        // tier, bytes, ptr
    kFree,            // tier, bytes, ptr
    kCompute,         // work, seconds
    kTransfer,        // flag (unordered), seconds, ticket (returned)
    kWaitTransfer,    // ticket
    kCollective,      // flag (deferred), seconds, ticket (returned)
    kWaitCollective,  // ticket
  };
  Kind kind;
  uint8_t arg = 0;     // the tier, the work, or the flag
  uint64_t value = 0;  // bytes, or the ticket
  double seconds = 0;
  uintptr_t ptr = 0;
};

// The events of one recorded stretch of a replay, up to `limit`: past it only `overflowed` is
// set (what is recorded is plan state, bounded whatever the length: issue 53 R6).
struct MetaRecord {
  explicit MetaRecord(size_t limit) : limit(limit) {}
  void Add(const MetaEvent& e) {
    if (events.size() < limit) {
      events.push_back(e);
    } else {
      overflowed = true;
    }
  }
  size_t limit;
  bool overflowed = false;
  std::vector<MetaEvent> events;
};

// The streams of one rank's step, in predicted seconds from the step's start.
class StepClock {
 public:
  enum class Work { kGemm, kAttention, kElementwise, kTransfer, kCollective, kNumWork };
  // Which part of the step the compute stream is in: a block's first forward, a forward run
  // again because its input was not held (LlamaModel::Regrow), the backward's recompute of what
  // a block's forward freed, a block's backward, or anything else (embedding, loss, update).
  enum class Phase { kOther, kForward, kRegrow, kRecompute, kBackward, kNumPhases };

  // `s` seconds of `what` on the compute stream, after everything it waits for.
  void Compute(double s, Work what);
  // A transfer of `s` seconds on the copy stream, after the compute issued so far unless
  // `unordered`; transfers run in order. Returns its ticket.
  uint64_t Transfer(double s, bool unordered);
  // The compute stream waits for the transfer `ticket` (and every one before it).
  void WaitTransfer(uint64_t ticket);
  // A collective of `s` seconds on the comm stream, after the compute issued so far. Unless
  // `deferred` the compute stream waits for it at once; else WaitCollective does. Returns its
  // ticket.
  uint64_t Collective(double s, bool deferred);
  void WaitCollective(uint64_t ticket);

  // Every call from now on is also added to `record` (nullptr: none), as MetaEvents.
  void set_record(MetaRecord* record) { record_ = record; }

  // When the last work of any stream ends.
  double end() const;
  double compute_end() const { return compute_; }
  // Seconds of each kind of work (on whichever stream ran it).
  double busy(Work w) const { return busy_[static_cast<int>(w)]; }
  // Seconds the compute stream stood waiting for transfers and collectives.
  double waited() const { return waited_; }
  // Compute from now on is counted under `p` (set by the planner's block runner around each
  // block call).
  void set_phase(Phase p) { phase_ = p; }
  // Compute seconds counted under `p`.
  double computed_in(Phase p) const { return phase_busy_[static_cast<int>(p)]; }

 private:
  double compute_ = 0, copy_ = 0, comm_ = 0;
  double waited_ = 0;
  double busy_[static_cast<int>(Work::kNumWork)] = {};
  Phase phase_ = Phase::kOther;
  double phase_busy_[static_cast<int>(Phase::kNumPhases)] = {};
  std::vector<double> transfer_end_, collective_end_;  // by ticket - 1
  MetaRecord* record_ = nullptr;
  void Wait(const std::vector<double>& ends, uint64_t ticket);
};

}  // namespace ithaca
