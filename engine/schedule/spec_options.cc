#include "engine/schedule/spec_options.h"

#include <algorithm>

namespace ithaca {

LlamaModel::Options ModelOptionsFromSpec(const JobSpec& spec) {
  const JobSpec::Memory& m = spec.memory;
  LlamaModel::Options o;
  o.recompute = m.recompute;
  o.attention_aware_blocks = m.attention_aware_blocks;
  o.tile_tokens = m.tile_tokens;
  o.head_chunk = m.head_chunk;
  o.ring = spec.parallel.ring;
  // An "auto" not yet resolved (the planner's starting point): offload off (and none kept on the
  // device under it), prefetch and overlap on, every block's input saved.
  o.offload = m.offload == OffloadChoice::kOn;
  o.offload_keep_last = std::max<int64_t>(0, m.offload_keep_last);
  o.prefetch = m.prefetch != OffloadChoice::kOff;
  o.recompute_interval = m.recompute_interval > 0 ? m.recompute_interval : 1;
  o.saved_block_inputs = m.saved_block_inputs;
  o.fsdp = spec.parallel.fsdp;
  o.overlap = m.overlap != OffloadChoice::kOff;
  o.param_offload = m.param_offload == OffloadChoice::kOn;
  return o;
}

}  // namespace ithaca
