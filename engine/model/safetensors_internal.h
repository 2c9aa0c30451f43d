// What the safetensors reader (safetensors.cc) and writers (safetensors_writer.cc) share.
#pragma once

#include "engine/core/tensor.h"

namespace ithaca {

inline constexpr char kSingleName[] = "model.safetensors";
inline constexpr char kIndexName[] = "model.safetensors.index.json";
// The dtype's name in a header ("F32", "BF16", "I32").
const char* FileDTypeName(DType t);

}  // namespace ithaca
