// Tensor: a non-owning view (pointer, dtype, shape, device). Ownership lives in memory/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace ithaca {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string ShapeString(const Shape& shape);
int64_t NumElements(const Shape& shape);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Device device = Device::kCpu;

  Tensor() = default;
  Tensor(void* d, DType t, Shape s, Device dev = Device::kCpu)
      : data(d), dtype(t), shape(std::move(s)), device(dev) {}

  int64_t numel() const { return NumElements(shape); }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  float* f32() const {
    ITHACA_CHECK(dtype == DType::kF32, "tensor is ", DTypeName(dtype), ", not f32");
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    ITHACA_CHECK(dtype == DType::kI32, "tensor is ", DTypeName(dtype), ", not i32");
    return static_cast<int32_t*>(data);
  }

  // Same memory, another shape with the same element count.
  Tensor Reshaped(Shape s) const;
  // Rows [begin, end) of the leading dimension.
  Tensor Rows(int64_t begin, int64_t end) const;
  // A flat view of `n` elements starting `offset` elements in.
  Tensor Slice(int64_t offset, Shape s) const;

  std::string DebugString() const;
};

}  // namespace ithaca
