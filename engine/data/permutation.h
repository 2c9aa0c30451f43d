// The shuffled window order of the DataLoader: a keyed bijection on [0, n) (a Feistel network on
// the next even power of two, cycle-walking back into range), so any position maps to its window
// in O(1) without storing a permutation.
#pragma once

#include <cstdint>

namespace ithaca {

// SplitMix64's output function: the round function of Permute, and how seeds are derived.
uint64_t SplitMix64(uint64_t x);
// The image of `index` (in [0, n)) under the permutation of [0, n) that `key` selects.
int64_t Permute(int64_t index, int64_t n, uint64_t key);

}  // namespace ithaca
