#include "engine/comm/comm_checks.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace ithaca {
namespace {

const char* DeviceName(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

absl::Status SameDType(const char* op, const Tensor& in, const Tensor& out) {
  if (in.dtype != out.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": input is ", DTypeName(in.dtype),
                                                   " but output is ", DTypeName(out.dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTensor(const char* op, const char* what, const Tensor& t, Device device) {
  if (t.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " is on ", DeviceName(t.device),
                                                   ", this communicator ", "works on ",
                                                   DeviceName(device), " tensors"));
  }
  if (t.numel() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " has a negative shape ", ShapeString(t.shape)));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " has no data"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGather(const Tensor& in, const Tensor& out, int rank, int size,
                            Device device) {
  RETURN_IF_ERROR(CheckTensor("all_gather", "input", in, device));
  RETURN_IF_ERROR(CheckTensor("all_gather", "output", out, device));
  RETURN_IF_ERROR(SameDType("all_gather", in, out));
  if (out.numel() != in.numel() * size) {
    return absl::InvalidArgumentError(absl::StrCat("all_gather: output has ", out.numel(),
                                                   " elements, expected ", size, " ranks x ",
                                                   in.numel(), " = ", in.numel() * size));
  }
  if (Overlaps(in.data, in.bytes(), out.data, out.bytes()) &&
      in.data != static_cast<char*>(out.data) + rank * in.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all_gather: input overlaps the output but is not rank ", rank, "'s slot of it"));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatter(const Tensor& in, const Tensor& out, int rank, int size,
                                Device device) {
  RETURN_IF_ERROR(CheckTensor("reduce_scatter", "input", in, device));
  RETURN_IF_ERROR(CheckTensor("reduce_scatter", "output", out, device));
  RETURN_IF_ERROR(SameDType("reduce_scatter", in, out));
  if (in.numel() != out.numel() * size) {
    return absl::InvalidArgumentError(absl::StrCat("reduce_scatter: input has ", in.numel(),
                                                   " elements, expected ", size, " ranks x ",
                                                   out.numel(), " = ", out.numel() * size));
  }
  if (Overlaps(in.data, in.bytes(), out.data, out.bytes()) &&
      out.data != static_cast<char*>(in.data) + rank * out.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter: output overlaps the input but is not rank ", rank, "'s chunk of it"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllToAll(const Tensor& in, const Tensor& out, int size, Device device) {
  RETURN_IF_ERROR(CheckTensor("all_to_all", "input", in, device));
  RETURN_IF_ERROR(CheckTensor("all_to_all", "output", out, device));
  RETURN_IF_ERROR(SameDType("all_to_all", in, out));
  if (in.numel() != out.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("all_to_all: input has ", in.numel(),
                                                   " elements but output has ", out.numel()));
  }
  if (in.numel() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all_to_all: ", in.numel(), " elements do not split into ", size, " equal chunks"));
  }
  if (Overlaps(in.data, in.bytes(), out.data, out.bytes())) {
    return absl::InvalidArgumentError(
        "all_to_all: input and output overlap (not supported "
        "in place, as in NCCL)");
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduce(const Tensor& x, Device device) {
  return CheckTensor("all_reduce", "tensor", x, device);
}

absl::Status CheckBroadcast(const Tensor& x, int root, int size, Device device) {
  RETURN_IF_ERROR(CheckTensor("broadcast", "tensor", x, device));
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast: root ", root, " is not a rank of ", size));
  }
  return absl::OkStatus();
}

absl::Status CheckSendRecv(const Tensor& send, int dst, const Tensor& recv, int src, int rank,
                           int size, Device device) {
  RETURN_IF_ERROR(CheckTensor("send_recv", "send", send, device));
  RETURN_IF_ERROR(CheckTensor("send_recv", "recv", recv, device));
  RETURN_IF_ERROR(SameDType("send_recv", send, recv));
  if (send.numel() != recv.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("send_recv: send has ", send.numel(),
                                                   " elements but recv has ", recv.numel()));
  }
  if (dst < 0 || dst >= size || src < 0 || src >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("send_recv: dst ", dst, " and src ", src, " must be ranks of ", size));
  }
  // A rank sending to itself must receive from itself: any other pairing sends one way only.
  if ((dst == rank) != (src == rank)) {
    return absl::InvalidArgumentError(absl::StrCat("send_recv: rank ", rank, " sends to rank ", dst,
                                                   " but receives from rank ", src,
                                                   "; a copy to itself needs dst == src == rank"));
  }
  if (Overlaps(send.data, send.bytes(), recv.data, recv.bytes())) {
    return absl::InvalidArgumentError("send_recv: send and recv overlap");
  }
  return absl::OkStatus();
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

void SumChunksInOrder(DType dtype, const void* src, int parts, size_t n, void* dst) {
  switch (dtype) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      float* d = static_cast<float*>(dst);
      std::memcpy(d, s, n * sizeof(float));
      for (int k = 1; k < parts; ++k) {
        const float* sk = s + static_cast<size_t>(k) * n;
        for (size_t i = 0; i < n; ++i) d[i] += sk[i];
      }
      return;
    }
    case DType::kI32: {
      // Unsigned arithmetic: overflow wraps instead of being undefined.
      const uint32_t* s = static_cast<const uint32_t*>(src);
      uint32_t* d = static_cast<uint32_t*>(dst);
      std::memcpy(d, s, n * sizeof(uint32_t));
      for (int k = 1; k < parts; ++k) {
        const uint32_t* sk = s + static_cast<size_t>(k) * n;
        for (size_t i = 0; i < n; ++i) d[i] += sk[i];
      }
      return;
    }
    case DType::kBF16: {
      const bf16* s = static_cast<const bf16*>(src);
      bf16* d = static_cast<bf16*>(dst);
      std::vector<float> acc(n);
      for (size_t i = 0; i < n; ++i) acc[i] = Bf16ToFloat(s[i]);
      for (int k = 1; k < parts; ++k) {
        const bf16* sk = s + static_cast<size_t>(k) * n;
        for (size_t i = 0; i < n; ++i) acc[i] += Bf16ToFloat(sk[i]);
      }
      for (size_t i = 0; i < n; ++i) d[i] = FloatToBf16(acc[i]);
      return;
    }
  }
}

}  // namespace ithaca
