// AttentionBlocks: the query/key block sizes of the CPU flash attention, in a header of its own so
// cpu_ops.h can take them without pulling the OpenMP-annotated kernels into its includers.
#pragma once

#include <cstdint>

namespace ithaca {
namespace cpu {

// A parameter (not a constant) so tests can use small blocks and exercise the block boundaries.
struct AttentionBlocks {
  int64_t q = 64;
  int64_t k = 64;
};

}  // namespace cpu
}  // namespace ithaca
