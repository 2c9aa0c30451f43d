// Block tapes: a replay of the step on the meta device (meta.h) runs each distinct block call
// (forward, recompute, backward of a block with the same context, weights' shapes, inputs and
// saved buffers) once, recording what it did to the allocator and the step clock, and replays
// every identical call after it from that record: the same allocations and frees, in the same
// order and sizes, and the same clock calls. The planner's figures are therefore exactly the
// full replay's (planner_test compares them), at the cost of one block's schedule code per kind
// of block instead of every layer's (issue 54 F1: tens of identical layers, each walking its
// tiles, stages and ring steps).
//
// A call is replayed only when its record is self-contained: it waits only for transfers and
// collectives it issued, frees only what it allocated or what its saved buffers held, and leaves
// in them only those or new allocations. A call that is not, or whose record would be longer than
// kMaxEventsPerCall, is run every time.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/plan/meta.h"
#include "engine/plan/step_time.h"
#include "engine/schedule/block.h"

namespace ithaca {

class BlockTapes final : public BlockRunner {
 public:
  // `clock`: the replay's step clock, nullptr when it is not timed. Both outlive this.
  BlockTapes(MetaAllocator* alloc, StepClock* clock) : alloc_(alloc), clock_(clock) {}
  BlockTapes(const BlockTapes&) = delete;
  BlockTapes& operator=(const BlockTapes&) = delete;

  absl::Status Forward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                       const Tensor& y, BlockSaved* saved, bool keep_attention_output,
                       bool keep_mlp_input) override;
  absl::Status Recompute(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                         BlockSaved* saved) override;
  absl::Status Backward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                        const Tensor& x, BlockSaved* saved, const Tensor& dy) override;

  // Calls run (and recorded) and calls replayed from a record, for the tests.
  int64_t run() const { return run_; }
  int64_t replayed() const { return replayed_; }

 private:
  static constexpr int kSavedFields = 5;  // BlockSaved's buffers, in Fields' order
  // The most events one call's record keeps (32 bytes each: 2 MiB a tape, a few tapes a plan).
  // Llama-3-8B at 5M tokens on eight ranks records at most 16,829 a call (2K-token tiles, UPipe
  // stages of two heads); a call longer than this is
  // run every time.
  static constexpr size_t kMaxEventsPerCall = size_t{1} << 16;
  // One step of a record, its pointers and tickets made relative to the call.
  struct Step {
    enum class Kind : uint8_t {
      kAllocate,        // the call's allocation `index`
      kMake,            // the same, a buffer left in saved field `field` (Buffer::Make)
      kFree,            // the call's allocation `index`
      kFreeSaved,       // the buffer in saved field `field` on entry
      kCompute,         // work, seconds
      kTransfer,        // unordered, seconds
      kWaitTransfer,    // the call's transfer `index`, or none (0)
      kCollective,      // deferred, seconds
      kWaitCollective,  // the call's collective `index`, or none
    };
    Kind kind;
    uint8_t arg = 0;
    int field = -1;
    int64_t index = -1;
    uint64_t bytes = 0;
    double seconds = 0;
  };
  struct Tape {
    bool replayable = false;
    std::vector<Step> steps;
    // Per kMake step, in order: what Buffer::Make is asked for.
    std::vector<std::pair<DType, Shape>> makes;
  };

  // Runs `call` directly the first time `key` is seen (recording it), else replays its tape.
  template <typename Call>
  absl::Status RunOrReplay(const std::string& key, BlockSaved* saved, Call call);
  // The tape of one recorded call, or a tape that is not replayable.
  Tape Compile(const std::vector<MetaEvent>& events, const std::vector<uintptr_t>& saved_before,
               const BlockSaved& after) const;
  absl::Status Replay(const Tape& tape, BlockSaved* saved);

  MetaAllocator* alloc_;
  StepClock* clock_;
  std::map<std::string, Tape> tapes_;
  int64_t run_ = 0, replayed_ = 0;
};

}  // namespace ithaca
