// Argument checks the backends share. A mismatch is a bug in the caller, so they abort
// (ITHACA_CHECK) with a message naming the backend, the op and the argument.
#pragma once

#include "engine/core/tensor.h"

namespace ithaca {

class OpChecks {
 public:
  explicit constexpr OpChecks(const char* backend) : backend_(backend) {}

  void Shape(const Tensor& t, const ithaca::Shape& want, const char* op, const char* name) const {
    ITHACA_CHECK(t.shape == want, "", backend_, "::", op, ": ", name, " is ", t.DebugString(),
                 ", expected shape ", ShapeString(want));
  }
  void DTypeIs(const Tensor& t, DType want, const char* op, const char* name) const {
    ITHACA_CHECK(t.dtype == want, "", backend_, "::", op, ": ", name, " is ", t.DebugString(),
                 ", expected ", DTypeName(want));
  }
  void Numel(const Tensor& t, int64_t want, const char* op, const char* name) const {
    ITHACA_CHECK(t.numel() == want, "", backend_, "::", op, ": ", name, " is ", t.DebugString(),
                 ", expected ", want, " elements");
  }
  // Copy2D's arguments: one dtype, and every row of both strided views inside its tensor.
  void Copy2D(const Tensor& src, int64_t src_stride, const Tensor& dst, int64_t dst_stride,
              int64_t rows, int64_t cols) const {
    ITHACA_CHECK(src.dtype == dst.dtype, "", backend_, "::Copy2D: dtypes differ");
    if (rows == 0 || cols == 0) return;
    ITHACA_CHECK((rows - 1) * src_stride + cols <= src.numel() &&
                     (rows - 1) * dst_stride + cols <= dst.numel(),
                 "", backend_, "::Copy2D: ", rows, "x", cols, " out of bounds");
  }
  // Rows and columns of a tensor viewed as 2-D with its leading dims flattened.
  struct Dims2 {
    int64_t rows, cols;
  };
  Dims2 View2D(const Tensor& t, const char* op, const char* name) const {
    ITHACA_CHECK(t.rank() >= 1, "", backend_, "::", op, ": ", name, " is a scalar ",
                 t.DebugString());
    const int64_t cols = t.dim(-1);
    return Dims2{cols == 0 ? 0 : t.numel() / cols, cols};
  }

 private:
  const char* backend_;
};

// Whether two tensors' bytes overlap.
inline bool Overlap(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

}  // namespace ithaca
