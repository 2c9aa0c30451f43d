#include "engine/plan/step_time.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace ithaca {

// The committed tables, compiled in from engine/plan/rates/*.txt (rates_data.cc, a genrule).
extern const char kRatesH100[];
extern const char kRatesH200[];
extern const char kRatesCpu[];

bool GemmShape::operator<(const GemmShape& o) const {
  return std::tie(m, n, k, ta, tb, c_f32) < std::tie(o.m, o.n, o.k, o.ta, o.tb, o.c_f32);
}
bool GemmShape::operator==(const GemmShape& o) const {
  return std::tie(m, n, k, ta, tb, c_f32) == std::tie(o.m, o.n, o.k, o.ta, o.tb, o.c_f32);
}
size_t GemmShape::Hash::operator()(const GemmShape& g) const {
  size_t h = std::hash<int64_t>()(g.m);
  for (int64_t v : {g.n, g.k, int64_t(g.ta) | int64_t(g.tb) << 1 | int64_t(g.c_f32) << 2}) {
    h = h * 1000003 ^ std::hash<int64_t>()(v);
  }
  return h;
}

namespace {

constexpr const char* kOpNames[] = {
    "fill",        "copy", "axpy",   "reduce",     "embedding",     "embedding_bwd", "rmsnorm",
    "rmsnorm_bwd", "rope", "swiglu", "swiglu_bwd", "cross_entropy", "adamw"};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) ==
              static_cast<size_t>(ElementwiseOp::kNumOps));

absl::Status LineError(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("rate table line ", line, ": ", what));
}

double Log2(double x) { return std::log2(std::max(1.0, x)); }

}  // namespace

const char* ElementwiseOpName(ElementwiseOp op) { return kOpNames[static_cast<int>(op)]; }

absl::StatusOr<RateTable> ParseRateTable(const std::string& text) {
  RateTable t;
  int line_no = 0;
  for (const std::string& raw : std::vector<std::string>(absl::StrSplit(text, '\n'))) {
    ++line_no;
    const std::string line = raw.substr(0, raw.find('#'));
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (f.empty()) continue;
    const std::string& kind = f[0];
    if (kind == "device" || kind == "note") {
      const std::string rest(
          absl::StripAsciiWhitespace(line.substr(line.find(kind) + kind.size())));
      (kind == "device" ? t.device : t.note) = rest;
      continue;
    }
    std::vector<double> v;
    for (size_t i = (kind == "attention" || kind == "op") ? 2 : 1; i < f.size(); ++i) {
      double x = 0;
      if (!absl::SimpleAtod(f[i], &x) || !std::isfinite(x) || x < 0) {
        return LineError(line_no, absl::StrCat("\"", f[i], "\" is not a non-negative number"));
      }
      v.push_back(x);
    }
    auto need = [&](size_t n) -> absl::Status {
      if (v.size() != n) {
        return LineError(line_no,
                         absl::StrCat("`", kind, "` takes ", n, " numbers, got ", v.size()));
      }
      return absl::OkStatus();
    };
    if (kind == "gemm") {
      RETURN_IF_ERROR(need(7));
      GemmRate g;
      g.shape = {int64_t(v[0]), int64_t(v[1]), int64_t(v[2]), v[3] != 0, v[4] != 0, v[5] != 0};
      g.seconds = v[6];
      t.gemms.push_back(g);
    } else if (kind == "attention") {
      if (f.size() < 2 || (f[1] != "fwd" && f[1] != "bwd")) {
        return LineError(line_no, "attention takes fwd|bwd HEAD_DIM HEADS SEQ FLOPS_PER_S");
      }
      RETURN_IF_ERROR(need(4));
      t.attention.push_back({f[1] == "bwd", int64_t(v[0]), int64_t(v[1]), int64_t(v[2]), v[3]});
    } else if (kind == "op") {
      if (f.size() < 2) return LineError(line_no, "op takes NAME BYTES_PER_S LAUNCH_S");
      RETURN_IF_ERROR(need(2));
      t.ops[f[1]] = {v[0], v[1]};
    } else if (kind == "h2d" || kind == "d2h" || kind == "host_adamw" || kind == "gemm_flops") {
      RETURN_IF_ERROR(need(1));
      double* field = kind == "h2d"          ? &t.h2d_bytes_per_s
                      : kind == "d2h"        ? &t.d2h_bytes_per_s
                      : kind == "host_adamw" ? &t.host_adamw_params_per_s
                                             : &t.gemm_flops_per_s;
      *field = v[0];
    } else {
      return LineError(line_no, absl::StrCat("unknown record \"", kind, "\""));
    }
  }
  if (t.gemms.empty() && t.gemm_flops_per_s <= 0) {
    return absl::InvalidArgumentError("rate table: no gemm shapes and no gemm_flops");
  }
  return t;
}

std::string RateTableText(const RateTable& t) {
  std::string out;
  if (!t.device.empty()) absl::StrAppend(&out, "device ", t.device, "\n");
  if (!t.note.empty()) absl::StrAppend(&out, "note ", t.note, "\n");
  auto num = [](double x) { return absl::StrFormat("%.6g", x); };
  if (t.gemm_flops_per_s > 0) absl::StrAppend(&out, "gemm_flops ", num(t.gemm_flops_per_s), "\n");
  if (t.h2d_bytes_per_s > 0) absl::StrAppend(&out, "h2d ", num(t.h2d_bytes_per_s), "\n");
  if (t.d2h_bytes_per_s > 0) absl::StrAppend(&out, "d2h ", num(t.d2h_bytes_per_s), "\n");
  if (t.host_adamw_params_per_s > 0) {
    absl::StrAppend(&out, "host_adamw ", num(t.host_adamw_params_per_s), "\n");
  }
  for (const auto& [name, r] : t.ops) {
    absl::StrAppend(&out, "op ", name, " ", num(r.bytes_per_s), " ", num(r.launch_s), "\n");
  }
  for (const AttentionRate& a : t.attention) {
    absl::StrAppend(&out, "attention ", a.backward ? "bwd" : "fwd", " ", a.head_dim, " ", a.heads,
                    " ", a.seq, " ", num(a.flops_per_s), "\n");
  }
  for (const GemmRate& g : t.gemms) {
    const GemmShape& s = g.shape;
    absl::StrAppend(&out, "gemm ", s.m, " ", s.n, " ", s.k, " ", int(s.ta), " ", int(s.tb), " ",
                    int(s.c_f32), " ", num(g.seconds), "\n");
  }
  return out;
}

std::vector<std::string> BuiltinRateTableNames() { return {"h100", "h200", "cpu"}; }

absl::StatusOr<RateTable> BuiltinRateTable(const std::string& name) {
  if (name == "h100") return ParseRateTable(kRatesH100);
  if (name == "h200") return ParseRateTable(kRatesH200);
  if (name == "cpu") return ParseRateTable(kRatesCpu);
  return absl::NotFoundError(
      absl::StrCat("no rate table \"", name, "\" (there are: h100, h200, cpu)"));
}

std::string RateTableNameFor(Device device, const std::string& gpu_name) {
  if (device != Device::kCuda) return "cpu";
  return absl::StrContains(absl::AsciiStrToLower(gpu_name), "h100") ? "h100" : "h200";
}

const RateTable& DefaultRateTable(Device device, const std::string& gpu_name) {
  // Parsed once; the committed tables are checked by step_time_test, so they parse.
  static const RateTable* h100 = new RateTable(*BuiltinRateTable("h100"));
  static const RateTable* h200 = new RateTable(*BuiltinRateTable("h200"));
  static const RateTable* cpu = new RateTable(*BuiltinRateTable("cpu"));
  const std::string name = RateTableNameFor(device, gpu_name);
  return name == "h100" ? *h100 : name == "h200" ? *h200 : *cpu;
}

double AttentionPairs(int64_t seq, int64_t window, const std::vector<int64_t>& doc_starts) {
  auto pairs_of = [](double n, double W) {
    return W > 0 && W < n ? 2 * W * n - W * (W - 1) : n * n;
  };
  const double W = static_cast<double>(window);
  if (doc_starts.size() <= 1) return pairs_of(double(seq), W);
  double pairs = 0;
  for (size_t i = 0; i < doc_starts.size(); ++i) {
    const double end = i + 1 < doc_starts.size() ? double(doc_starts[i + 1]) : double(seq);
    pairs += pairs_of(end - double(doc_starts[i]), W);
  }
  return pairs;
}

double AttentionChunkPairs(int64_t sq, int64_t sk, int64_t q_pos0, int64_t k_pos0, int64_t window,
                           const std::vector<int64_t>& doc_starts) {
  // Keys query p sees: [max(doc start, p − window + 1, k_pos0), min(p, last key)].
  auto seen = [&](int64_t p) -> double {
    int64_t first = k_pos0;
    if (doc_starts.size() > 1) {
      const auto it = std::upper_bound(doc_starts.begin(), doc_starts.end(), p);
      first = std::max(first, *(it - 1));
    }
    if (window > 0) first = std::max(first, p - window + 1);
    const int64_t last = std::min(p, k_pos0 + sk - 1);
    return last >= first ? double(last - first + 1) : 0.0;
  };
  constexpr int64_t kExact = 4096, kSamples = 1024;
  double visible = 0;
  if (sq <= kExact) {
    for (int64_t i = 0; i < sq; ++i) visible += seen(q_pos0 + i);
  } else {
    const double width = double(sq) / kSamples;
    for (int64_t n = 0; n < kSamples; ++n) {
      visible += seen(q_pos0 + static_cast<int64_t>((n + 0.5) * width)) * width;
    }
  }
  return 2 * visible;
}

double AttentionFlops(bool backward, double pairs, int64_t heads, int64_t head_dim) {
  return (backward ? 4.0 : 2.0) * pairs * double(heads) * double(head_dim);
}

double GemmSeconds(const RateTable& t, const GemmShape& g) {
  const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
  // The nearest measured shape in log space, same layout first; its time scaled by FLOPs.
  const GemmRate* best = nullptr;
  double best_d = std::numeric_limits<double>::infinity();
  for (const GemmRate& r : t.gemms) {
    const GemmShape& s = r.shape;
    const double layout = (s.ta != g.ta) + (s.tb != g.tb) + (s.c_f32 != g.c_f32);
    const double d = 100 * layout + std::abs(Log2(s.m) - Log2(g.m)) +
                     std::abs(Log2(s.n) - Log2(g.n)) + std::abs(Log2(s.k) - Log2(g.k));
    if (d < best_d) {
      best_d = d;
      best = &r;
    }
  }
  if (best == nullptr) return flops / std::max(1.0, t.gemm_flops_per_s);
  const GemmShape& s = best->shape;
  return best->seconds * flops / (2.0 * double(s.m) * double(s.n) * double(s.k));
}

double AttentionSeconds(const RateTable& t, bool backward, int64_t seq, double pairs, int64_t heads,
                        int64_t head_dim) {
  const double flops = AttentionFlops(backward, pairs, heads, head_dim);
  // The rows of this pass at the nearest head_dim, then the nearest head count, by length.
  auto nearest = [](int64_t have, int64_t best, int64_t want) {
    return best == 0 || std::abs(Log2(have) - Log2(want)) < std::abs(Log2(best) - Log2(want));
  };
  int64_t hd = 0, hs = 0;
  for (const AttentionRate& a : t.attention) {
    if (a.backward == backward && nearest(a.head_dim, hd, head_dim)) hd = a.head_dim;
  }
  for (const AttentionRate& a : t.attention) {
    if (a.backward == backward && a.head_dim == hd && nearest(a.heads, hs, heads)) hs = a.heads;
  }
  std::vector<const AttentionRate*> rows;
  for (const AttentionRate& a : t.attention) {
    if (a.backward == backward && a.head_dim == hd && a.heads == hs) rows.push_back(&a);
  }
  if (rows.empty()) return flops / std::max(1.0, t.gemm_flops_per_s * 0.7);
  std::sort(rows.begin(), rows.end(),
            [](const AttentionRate* a, const AttentionRate* b) { return a->seq < b->seq; });
  // Masks (documents, a window) run at the rate of a causal sample as long as the keys each
  // query sees: pairs / seq.
  const double eff = std::max(1.0, pairs / std::max<double>(1, double(seq)));
  double rate = rows.front()->flops_per_s;
  if (eff >= double(rows.back()->seq)) {
    rate = rows.back()->flops_per_s;
  } else if (eff > double(rows.front()->seq)) {
    for (size_t i = 1; i < rows.size(); ++i) {
      if (eff <= double(rows[i]->seq)) {
        const double x0 = Log2(rows[i - 1]->seq), x1 = Log2(rows[i]->seq);
        const double w = x1 > x0 ? (Log2(eff) - x0) / (x1 - x0) : 1;
        rate = rows[i - 1]->flops_per_s * (1 - w) + rows[i]->flops_per_s * w;
        break;
      }
    }
  }
  return flops / std::max(1.0, rate);
}

OpRate ElementwiseRate(const RateTable& t, ElementwiseOp op) {
  auto it = t.ops.find(ElementwiseOpName(op));
  if (it == t.ops.end()) it = t.ops.find("copy");
  return it == t.ops.end() ? OpRate{} : it->second;
}

double ElementwiseSeconds(const OpRate& rate, int64_t bytes) {
  if (rate.bytes_per_s <= 0) return double(bytes) / 1e12;
  return rate.launch_s + double(bytes) / rate.bytes_per_s;
}

double ElementwiseSeconds(const RateTable& t, ElementwiseOp op, int64_t bytes) {
  return ElementwiseSeconds(ElementwiseRate(t, op), bytes);
}

double TransferSeconds(const RateTable& t, bool to_device, int64_t bytes) {
  const double bw = to_device ? t.h2d_bytes_per_s : t.d2h_bytes_per_s;
  return double(bytes) / (bw > 0 ? bw : 25e9);
}

void StepClock::Compute(double s, Work what) {
  if (record_) record_->Add({MetaEvent::Kind::kCompute, uint8_t(what), 0, s});
  compute_ += s;
  busy_[static_cast<int>(what)] += s;
  phase_busy_[static_cast<int>(phase_)] += s;
}

uint64_t StepClock::Transfer(double s, bool unordered) {
  const double start = unordered ? copy_ : std::max(copy_, compute_);
  copy_ = start + s;
  busy_[static_cast<int>(Work::kTransfer)] += s;
  transfer_end_.push_back(copy_);
  if (record_) {
    record_->Add({MetaEvent::Kind::kTransfer, uint8_t(unordered), transfer_end_.size(), s});
  }
  return transfer_end_.size();
}

void StepClock::WaitTransfer(uint64_t ticket) {
  if (record_) record_->Add({MetaEvent::Kind::kWaitTransfer, 0, ticket});
  Wait(transfer_end_, ticket);
}

uint64_t StepClock::Collective(double s, bool deferred) {
  const double start = std::max(comm_, compute_);
  comm_ = start + s;
  busy_[static_cast<int>(Work::kCollective)] += s;
  collective_end_.push_back(comm_);
  const uint64_t ticket = collective_end_.size();
  if (record_) record_->Add({MetaEvent::Kind::kCollective, uint8_t(deferred), ticket, s});
  if (!deferred) Wait(collective_end_, ticket);
  return ticket;
}

void StepClock::WaitCollective(uint64_t ticket) {
  if (record_) record_->Add({MetaEvent::Kind::kWaitCollective, 0, ticket});
  Wait(collective_end_, ticket);
}

void StepClock::Wait(const std::vector<double>& ends, uint64_t ticket) {
  if (ticket == 0 || ticket > ends.size()) return;
  const double e = ends[ticket - 1];
  if (e > compute_) {
    waited_ += e - compute_;
    compute_ = e;
  }
}

double StepClock::end() const { return std::max({compute_, copy_, comm_}); }

}  // namespace ithaca
