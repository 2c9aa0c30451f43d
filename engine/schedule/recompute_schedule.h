// RecomputeSchedule: which block inputs a training step's forward saves, and how its backward
// rebuilds the others. Backward runs the blocks from the last to the first, and block l's
// backward needs its input x_l. The forward saves some of them; the blocks after a saved one, up
// to the next saved one, are its group. When backward reaches a block whose input is not held,
// it re-runs the forward ("regrows") from the nearest held input below it, holding the input it
// ends at, and repeats until block l's is held. A regrown input is freed after its block's
// backward, like a saved one.
//
// Two ways to choose, one executor (LlamaModel::TakeSaved):
// - Every(L, k), `memory.recompute_interval`: every k-th block's input is saved, and a group's
//   others are regrown one block at a time when backward reaches the group: each block's
//   forward runs once more and the device holds up to L/k + k − 1 inputs.
// - AtMost(L, n), `memory.saved_block_inputs`: never more than n inputs held at once, saved and
//   regrown together, with the fewest regrowing block forwards for that n. A dynamic program
//   over where to save and where each regrowth stops (Griewank's binomial checkpointing): for
//   Llama-3-8B's 32 blocks, 10 held cost 22 block forwards, 6 held 37, where Every(32, 6) holds
//   10 for 26.
#pragma once

#include <cstdint>
#include <vector>

namespace ithaca {

class RecomputeSchedule {
 public:
  static RecomputeSchedule Every(int64_t num_blocks, int64_t k);
  // n >= 2, or n >= 1 for one block; n >= num_blocks saves every input.
  static RecomputeSchedule AtMost(int64_t num_blocks, int64_t n);

  int64_t num_blocks() const { return static_cast<int64_t>(group_of_.size()); }
  // Whether the forward saves block l's input (block 0's always).
  bool saved(int64_t l) const { return starts_[group_of_[l]] == l; }
  // The saved block that starts l's group.
  int64_t group_start(int64_t l) const { return starts_[group_of_[l]]; }
  // How many regrown inputs l's group may hold at once.
  int64_t group_slots(int64_t l) const { return slots_[group_of_[l]]; }
  // Backward needs the input of a block n − 1 blocks after a held one and may hold `slots` more
  // inputs: how many blocks to run forward before holding the input reached (1 <= m <= n − 1).
  int64_t Split(int64_t n, int64_t slots) const { return split_[n][slots]; }
  // Backward's next regrowth for block l, whose input is not held, given which inputs are held
  // now (`held(j)`; the group's saved input is): run blocks [from, to) forward from the highest
  // held input below l and hold the input reached, `to` (at most l). The executor and Simulate
  // both ask this.
  struct Regrowth {
    int64_t from, to;
  };
  template <typename Held>
  Regrowth NextRegrowth(int64_t l, const Held& held) const {
    const int64_t l0 = group_start(l);
    int64_t h = l - 1, free = group_slots(l);
    while (h > l0 && !held(h)) --h;
    for (int64_t j = l0 + 1; j < l; ++j) free -= held(j);
    return {h, h + Split(l + 1 - h, free)};
  }

  // What the schedule costs, by running its decisions as the executor does: the block forwards
  // the backward adds, and the most inputs held at once.
  struct Cost {
    int64_t regrow_forwards = 0;
    int64_t peak_inputs = 0;
  };
  Cost Simulate() const;

 private:
  // cost_[n][s]: the fewest forwards that backpropagate n blocks from a held input of the first
  // with s more inputs allowed; split_[n][s] the first regrowth's length that achieves it.
  void Tabulate(int64_t max_n, int64_t max_s);

  std::vector<int64_t> starts_, slots_;  // per group
  std::vector<int64_t> group_of_;        // per block
  std::vector<std::vector<int64_t>> cost_, split_;
};

}  // namespace ithaca
