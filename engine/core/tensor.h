// Tensor: a non-owning view (pointer, dtype, shape, device). Ownership lives in memory/.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace ithaca {

enum class Device : uint8_t { kCpu, kCuda };

// A tensor's dimensions, at most kMaxDims, held inline: a view (Rows, Slice) allocates nothing.
// The planner replays a step's every tile through such views, millions of them at millions of
// tokens, where a std::vector's allocations were half its time. The interface is std::vector's
// where the code uses it.
class Shape {
 public:
  static constexpr size_t kMaxDims = 8;
  using value_type = int64_t;
  using size_type = size_t;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : Shape(dims.begin(), dims.end()) {}
  explicit Shape(size_t n, int64_t value = 0) { resize(n, value); }
  template <typename It, typename = decltype(*std::declval<It>())>
  Shape(It first, It last) {
    for (; first != last; ++first) push_back(*first);
  }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t* data() { return d_.data(); }
  const int64_t* data() const { return d_.data(); }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + n_; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  int64_t& operator[](size_t i) { return d_[i]; }
  int64_t operator[](size_t i) const { return d_[i]; }
  int64_t& front() { return d_[0]; }
  int64_t front() const { return d_[0]; }
  int64_t& back() { return d_[n_ - 1]; }
  int64_t back() const { return d_[n_ - 1]; }
  void push_back(int64_t v) {
    ITHACA_CHECK(n_ < kMaxDims, "a shape of more than ", kMaxDims, " dimensions");
    d_[n_++] = v;
  }
  void pop_back() { --n_; }
  void clear() { n_ = 0; }
  void resize(size_t n, int64_t value = 0) {
    ITHACA_CHECK(n <= kMaxDims, "a shape of ", n, " dimensions; at most ", kMaxDims);
    for (size_t i = n_; i < n; ++i) d_[i] = value;
    n_ = static_cast<uint8_t>(n);
  }
  iterator insert(const_iterator pos, int64_t v) {
    const size_t at = static_cast<size_t>(pos - begin());
    push_back(v);
    std::rotate(begin() + at, end() - 1, end());
    return begin() + at;
  }
  iterator erase(const_iterator pos) {
    const size_t at = static_cast<size_t>(pos - begin());
    std::copy(begin() + at + 1, end(), begin() + at);
    --n_;
    return begin() + at;
  }

  friend bool operator==(const Shape& a, const Shape& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
  friend bool operator<(const Shape& a, const Shape& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::array<int64_t, kMaxDims> d_{};
  uint8_t n_ = 0;
};

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
