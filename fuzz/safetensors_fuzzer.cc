// libFuzzer harness: one .safetensors file (engine/model/safetensors.h). Open validates the
// header; every tensor it accepts must then read back (converted to f32 and to bf16) without
// touching memory outside the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ithaca::fuzz::InputFile file(".safetensors");
  auto reader = ithaca::SafetensorsReader::Open(file.Write(data, size));
  if (!reader.ok()) return 0;
  (void)(*reader)->Metadata();
  for (const std::string& name : (*reader)->Names()) {
    absl::StatusOr<ithaca::TensorInfo> info = (*reader)->Info(name);
    if (!info.ok()) std::abort();  // Names() lists only what Info knows
    // Open checked the tensor fits in the file, so this allocation is bounded by the input.
    const int64_t n = ithaca::NumElements(info->shape);
    std::vector<uint32_t> buffer(static_cast<size_t>(n));  // room for any dtype
    if (info->dtype == ithaca::DType::kI32) {              // read only as itself
      if (!(*reader)->Read(name, info->shape, info->dtype, buffer.data()).ok()) std::abort();
      continue;
    }
    for (ithaca::DType to : {ithaca::DType::kF32, ithaca::DType::kBF16}) {
      if (!(*reader)->Read(name, info->shape, to, buffer.data()).ok()) std::abort();
    }
  }
  return 0;
}
