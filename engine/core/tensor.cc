#include "engine/core/tensor.h"

#include <cstdio>
#include <cstdlib>

namespace ithaca {

void CheckFailed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, cond, msg.c_str());
  std::abort();
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

Tensor Tensor::Reshaped(Shape s) const {
  ITHACA_CHECK(NumElements(s) == numel(), "reshape ", ShapeString(shape), " -> ", ShapeString(s));
  return Tensor(data, dtype, std::move(s), device);
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  ITHACA_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape[0], "rows [", begin, ", ",
               end, ") of ", ShapeString(shape));
  Shape s = shape;
  s[0] = end - begin;
  int64_t row = numel() / (shape[0] ? shape[0] : 1);
  return Tensor(static_cast<char*>(data) + begin * row * DTypeSize(dtype), dtype, std::move(s),
                device);
}

Tensor Tensor::Slice(int64_t offset, Shape s) const {
  ITHACA_CHECK(offset >= 0 && offset + NumElements(s) <= numel(), "slice at ", offset, " of ",
               ShapeString(s), " from ", ShapeString(shape));
  return Tensor(static_cast<char*>(data) + offset * DTypeSize(dtype), dtype, std::move(s), device);
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype), ShapeString(shape),
                      device == Device::kCpu ? "@cpu" : "@cuda");
}

}  // namespace ithaca
