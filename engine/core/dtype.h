// Element types (f32, bf16, i32) and bf16 <-> f32 conversion on the host.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ithaca {

enum class DType : uint8_t { kF32, kBF16, kI32 };

inline size_t DTypeSize(DType t) { return t == DType::kBF16 ? 2 : 4; }
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

// bfloat16 as raw bits; conversion rounds to nearest even (NaN stays NaN).
struct bf16 {
  uint16_t bits;
};

inline bf16 FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float Bf16ToFloat(bf16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace ithaca
