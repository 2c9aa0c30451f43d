#include "engine/plan/block_tape.h"

#include <array>

#include "absl/strings/str_cat.h"

namespace ithaca {
namespace {

// Everything a block call's record depends on goes into its key. A member added to one of these
// structs must be added to the key too: the sizes are checked so that it is not forgotten.
// (In units of a Tensor where they hold Tensors, so that a change to Tensor alone moves none.)
static_assert(sizeof(UlyssesContext) == 192 + sizeof(Tensor),
              "a member of UlyssesContext: add it to the key");
static_assert(sizeof(BlockContext) == 216 + sizeof(Tensor),
              "a member of BlockContext: add it to the key");
static_assert(sizeof(HeadPlan) == 80, "a member of HeadPlan: add it to the key");
static_assert(sizeof(BlockWeights) == 8 + 28 * sizeof(Tensor),
              "a member of BlockWeights: add it to the key");
static_assert(sizeof(BlockSaved) == 5 * sizeof(Buffer), "a member of BlockSaved: add it");

std::array<Buffer*, 5> Fields(BlockSaved* s) {
  return {&s->rstd1, &s->o, &s->lse, &s->x2, &s->rstd2};
}

// A tensor as the meta device sees it: absent, or its type, shape and tier side (a copy is
// priced by whether its ends are on the host); its address is no input of the replay.
void AppendTensor(std::string* k, const Tensor& t) {
  if (t.data == nullptr) {
    k->append("-;");
    return;
  }
  absl::StrAppend(k, static_cast<int>(t.dtype), "/", static_cast<int>(t.device), "/",
                  MetaAllocator::IsHost(t.data) ? "h" : "d", "[");
  for (int64_t d : t.shape) absl::StrAppend(k, d, ",");
  k->append("];");
}

void AppendContext(std::string* k, const BlockContext& c) {
  const UlyssesContext& a = c.attn;
  const HeadPlan& p = a.plan;
  absl::StrAppend(k, "ctx:", reinterpret_cast<uintptr_t>(c.cfg), ",", c.tile_tokens, ",",
                  static_cast<int>(c.saved_attention_tier), ",", reinterpret_cast<uintptr_t>(a.ops),
                  ",", reinterpret_cast<uintptr_t>(a.alloc), ",", reinterpret_cast<uintptr_t>(a.sp),
                  ",", reinterpret_cast<uintptr_t>(a.ring), ",");
  absl::StrAppend(k, "plan:", p.P, ",", p.hq, ",", p.hkv, ",", p.g, ",", p.D, ",", p.u, ",", p.kvr,
                  ",", p.rounds, ",", p.stages_per_round, ",", p.replicated, ",");
  absl::StrAppend(k, a.rank, ",", a.s, ",", a.ring_rank, ",", a.ring_size, ",", a.overlap, ",",
                  a.qkv_bias, ",", a.qk_norm, ",", a.qk_norm_eps, ",", a.rope_scale,
                  ",docs:", a.docs.window, ":");
  for (int64_t s : a.docs.starts) absl::StrAppend(k, s, ",");
  AppendTensor(k, a.inv_freq);
}

void AppendWeights(std::string* k, const BlockWeights& w) {
  for (const Tensor* t : {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.mlp_norm, &w.w_gate, &w.w_up,
                          &w.w_down, &w.bq, &w.bk, &w.bv, &w.q_norm, &w.k_norm}) {
    AppendTensor(k, *t);
  }
  for (const LoraPair& l : w.lora) {
    AppendTensor(k, l.a);
    AppendTensor(k, l.b);
  }
  absl::StrAppend(k, w.lora_scale, "|");
}

// The saved buffers on entry, and which of the call's tensors share an address (a call could
// behave differently in place).
void AppendSavedAndAliases(std::string* k, BlockSaved* saved, std::vector<const void*> ptrs) {
  for (Buffer* b : Fields(saved)) {
    AppendTensor(k, b->tensor());
    absl::StrAppend(k, static_cast<int>(b->tier()), ";");
    ptrs.push_back(b->tensor().data);
  }
  k->append("alias:");
  for (size_t i = 0; i < ptrs.size(); ++i) {
    for (size_t j = i + 1; j < ptrs.size(); ++j) {
      if (ptrs[i] != nullptr && ptrs[i] == ptrs[j]) absl::StrAppend(k, i, "=", j, ",");
    }
  }
}

}  // namespace

absl::Status BlockTapes::Forward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                                 const Tensor& y, BlockSaved* saved, bool keep_attention_output,
                                 bool keep_mlp_input) {
  std::string key = absl::StrCat("F", keep_attention_output, keep_mlp_input, "|");
  AppendContext(&key, c);
  AppendWeights(&key, w);
  AppendTensor(&key, x);
  AppendTensor(&key, y);
  AppendSavedAndAliases(&key, saved, {x.data, y.data});
  return RunOrReplay(key, saved, [&] {
    return BlockForward(c, w, x, y, saved, keep_attention_output, keep_mlp_input);
  });
}

absl::Status BlockTapes::Recompute(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                                   BlockSaved* saved) {
  std::string key = "R|";
  AppendContext(&key, c);
  AppendWeights(&key, w);
  AppendTensor(&key, x);
  AppendSavedAndAliases(&key, saved, {x.data});
  return RunOrReplay(key, saved, [&] { return BlockRecompute(c, w, x, saved); });
}

absl::Status BlockTapes::Backward(const BlockContext& c, const BlockWeights& w,
                                  const BlockWeights& g, const Tensor& x, BlockSaved* saved,
                                  const Tensor& dy) {
  std::string key = "B|";
  AppendContext(&key, c);
  AppendWeights(&key, w);
  AppendWeights(&key, g);
  AppendTensor(&key, x);
  AppendTensor(&key, dy);
  AppendSavedAndAliases(&key, saved, {x.data, dy.data});
  return RunOrReplay(key, saved, [&] { return BlockBackward(c, w, g, x, saved, dy); });
}

template <typename Call>
absl::Status BlockTapes::RunOrReplay(const std::string& key, BlockSaved* saved, Call call) {
  auto it = tapes_.find(key);
  if (it != tapes_.end() && it->second.replayable) {
    ++replayed_;
    return Replay(it->second, saved);
  }
  ++run_;
  if (it != tapes_.end()) return call();
  std::vector<uintptr_t> before;
  for (Buffer* b : Fields(saved)) before.push_back(reinterpret_cast<uintptr_t>(b->tensor().data));
  MetaRecord record(kMaxEventsPerCall);
  alloc_->set_record(&record);
  if (clock_ != nullptr) clock_->set_record(&record);
  absl::Status st = call();
  alloc_->set_record(nullptr);
  if (clock_ != nullptr) clock_->set_record(nullptr);
  RETURN_IF_ERROR(st);
  // A call too long to keep (a short model at a huge length) runs every time.
  tapes_.emplace(key, record.overflowed ? Tape() : Compile(record.events, before, *saved));
  return absl::OkStatus();
}

BlockTapes::Tape BlockTapes::Compile(const std::vector<MetaEvent>& events,
                                     const std::vector<uintptr_t>& before,
                                     const BlockSaved& after) const {
  Tape t;                             // not replayable until the end
  std::map<uintptr_t, int64_t> live;  // the call's allocations not freed, by address
  std::vector<size_t> allocated_at;   // the step of each allocation
  std::array<bool, kSavedFields> freed_saved{};
  // The tickets a call issues are consecutive: its first, and how many.
  uint64_t transfer0 = 0, transfers = 0, collective0 = 0, collectives = 0;
  auto own = [](uint64_t ticket, uint64_t first, uint64_t n) -> int64_t {
    if (ticket == 0) return 0;
    if (n == 0 || ticket < first || ticket >= first + n) return -1;  // issued before the call
    return static_cast<int64_t>(ticket - first) + 1;
  };
  for (const MetaEvent& e : events) {
    Step s;
    s.arg = e.arg;
    s.bytes = e.value;
    s.seconds = e.seconds;
    switch (e.kind) {
      case MetaEvent::Kind::kAllocate:
        s.kind = Step::Kind::kAllocate;
        s.index = static_cast<int64_t>(allocated_at.size());
        live[e.ptr] = s.index;
        allocated_at.push_back(t.steps.size());
        break;
      case MetaEvent::Kind::kFree: {
        auto l = live.find(e.ptr);
        if (l != live.end()) {
          s.kind = Step::Kind::kFree;
          s.index = l->second;
          live.erase(l);
          break;
        }
        s.kind = Step::Kind::kFreeSaved;
        for (int f = 0; f < kSavedFields; ++f) {
          if (before[f] != 0 && before[f] == e.ptr && !freed_saved[f]) s.field = f;
        }
        if (s.field < 0) return Tape();  // something the call did not own
        freed_saved[s.field] = true;
        break;
      }
      case MetaEvent::Kind::kCompute:
        s.kind = Step::Kind::kCompute;
        break;
      case MetaEvent::Kind::kTransfer:
        s.kind = Step::Kind::kTransfer;
        if (transfers == 0) transfer0 = e.value;
        if (e.value != transfer0 + transfers++) return Tape();
        break;
      case MetaEvent::Kind::kCollective:
        s.kind = Step::Kind::kCollective;
        if (collectives == 0) collective0 = e.value;
        if (e.value != collective0 + collectives++) return Tape();
        break;
      case MetaEvent::Kind::kWaitTransfer:
        s.kind = Step::Kind::kWaitTransfer;
        s.index = own(e.value, transfer0, transfers);
        if (s.index < 0) return Tape();
        break;
      case MetaEvent::Kind::kWaitCollective:
        s.kind = Step::Kind::kWaitCollective;
        s.index = own(e.value, collective0, collectives);
        if (s.index < 0) return Tape();
        break;
    }
    t.steps.push_back(s);
  }
  // What the saved buffers hold after the call: what they held, or the call's allocations.
  std::array<const Buffer*, kSavedFields> out = {&after.rstd1, &after.o, &after.lse, &after.x2,
                                                 &after.rstd2};
  std::map<size_t, int> made;  // allocation step -> the field its buffer ends in
  for (int f = 0; f < kSavedFields; ++f) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(out[f]->tensor().data);
    const bool kept = before[f] != 0 && !freed_saved[f];
    if (kept) {
      if (p != before[f]) return Tape();  // moved elsewhere
      continue;
    }
    if (p == 0) continue;
    auto l = live.find(p);
    if (l == live.end()) return Tape();
    Step& s = t.steps[allocated_at[l->second]];
    const Tensor& v = out[f]->tensor();
    if (s.bytes != static_cast<uint64_t>(NumElements(v.shape)) * DTypeSize(v.dtype) ||
        s.arg != static_cast<uint8_t>(out[f]->tier())) {
      return Tape();
    }
    s.kind = Step::Kind::kMake;
    s.field = f;
    made[allocated_at[l->second]] = f;
    live.erase(l);
  }
  if (!live.empty()) return Tape();  // an allocation left somewhere the record cannot follow
  for (const auto& [step, f] : made) {
    t.makes.emplace_back(out[f]->tensor().dtype, out[f]->tensor().shape);
  }
  t.replayable = true;
  return t;
}

absl::Status BlockTapes::Replay(const Tape& t, BlockSaved* saved) {
  std::vector<void*> ptrs;
  std::array<Buffer, kSavedFields> made;  // placed in `saved` at the end, as the call left them
  const std::array<Buffer*, kSavedFields> fields = Fields(saved);
  size_t next_make = 0;
  uint64_t transfer0 = 0, collective0 = 0;
  for (const Step& s : t.steps) {
    const Tier tier = static_cast<Tier>(s.arg);
    switch (s.kind) {
      case Step::Kind::kAllocate: {
        ASSIGN_OR_RETURN(void* p, alloc_->Allocate(s.bytes, tier));
        ptrs.push_back(p);
        break;
      }
      case Step::Kind::kMake: {
        const auto& [dtype, shape] = t.makes[next_make++];
        ASSIGN_OR_RETURN(made[s.field], Buffer::Make(alloc_, dtype, shape, tier));
        ptrs.push_back(made[s.field].tensor().data);
        break;
      }
      case Step::Kind::kFree:
        alloc_->Free(ptrs[s.index], s.bytes, tier);
        break;
      case Step::Kind::kFreeSaved:
        fields[s.field]->Reset();
        break;
      case Step::Kind::kCompute:
        clock_->Compute(s.seconds, static_cast<StepClock::Work>(s.arg));
        break;
      case Step::Kind::kTransfer: {
        const uint64_t ticket = clock_->Transfer(s.seconds, s.arg != 0);
        if (transfer0 == 0) transfer0 = ticket;
        break;
      }
      case Step::Kind::kWaitTransfer:
        clock_->WaitTransfer(s.index == 0 ? 0 : transfer0 + s.index - 1);
        break;
      case Step::Kind::kCollective: {
        const uint64_t ticket = clock_->Collective(s.seconds, s.arg != 0);
        if (collective0 == 0) collective0 = ticket;
        break;
      }
      case Step::Kind::kWaitCollective:
        clock_->WaitCollective(s.index == 0 ? 0 : collective0 + s.index - 1);
        break;
    }
  }
  for (int f = 0; f < kSavedFields; ++f) {
    if (!made[f].empty()) *fields[f] = std::move(made[f]);
  }
  return absl::OkStatus();
}

}  // namespace ithaca
