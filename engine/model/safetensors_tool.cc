// safetensors_tool: the C++ side of tests/python/safetensors_interop.py.
//
//   safetensors_tool write <file>                   writes the known tensors (KnownTensors below)
//   safetensors_tool write-sharded <dir> <max_bytes> the same, through WriteSharded
//   safetensors_tool dump <path>                     prints every tensor as JSON, values as raw
//                                                    bits so the comparison is exact
//
// Errors go to stderr with exit status 1 (the Python test checks their text).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

// Mirrored in safetensors_interop.py: the values, and the bf16 rounding expected of them.
struct Known {
  std::vector<float> embed;  // "embed.weight": f32 [3, 4]
  std::vector<float> norm;   // "norm.weight": written as BF16 from f32 [8]
  std::vector<bf16> direct;  // "direct.bf16": bf16 data written as-is [2]
  std::vector<int32_t> ids;  // "ids": I32 [5]
  float scalar = 42.5f;      // "scalar": f32 []
};

Known KnownTensors() {
  Known k;
  for (int i = 0; i < 12; ++i) k.embed.push_back((i - 5) * 0.375f);
  k.embed[3] = -0.0f;
  k.embed[7] = 1e-40f;  // subnormal
  // Ties (1 + 2^-8 rounds down to even, 1 + 3·2^-8 up), ordinary values, overflow to inf.
  k.norm = {1.00390625f, 1.01171875f, 3.14159265f, -2.5e-3f,
            65504.0f,    1e30f,       3.4e38f,     -1.0f / 3.0f};
  k.direct = {bf16{0x3f80}, bf16{0xc0a0}};  // 1.0, -5.0
  k.ids = {INT32_MIN, -1, 0, 1, INT32_MAX};
  return k;
}

void AddKnown(const Known& k, SafetensorsWriter* w) {
  w->Add("embed.weight", DType::kF32, {3, 4}, k.embed.data(), DType::kF32);
  w->Add("norm.weight", DType::kF32, {8}, k.norm.data(), DType::kBF16);
  w->Add("direct.bf16", DType::kBF16, {2}, k.direct.data(), DType::kBF16);
  w->Add("ids", DType::kI32, {5}, k.ids.data(), DType::kI32);
  w->Add("scalar", DType::kF32, {}, &k.scalar, DType::kF32);
  w->Add("empty", DType::kF32, {0, 3}, nullptr, DType::kBF16);
  w->SetMetadata("format", "pt");
  w->SetMetadata("producer", "ithaca");
}

absl::Status Dump(const std::string& path) {
  ASSIGN_OR_RETURN(auto reader, SafetensorsReader::Open(path));
  Json tensors = Json::object();
  for (const std::string& name : reader->Names()) {
    ASSIGN_OR_RETURN(TensorInfo info, reader->Info(name));
    const size_t n = static_cast<size_t>(NumElements(info.shape));
    Json bits = Json::array();
    // Read in the file's own dtype, so the dump shows exactly the stored bits.
    if (info.dtype == DType::kBF16) {
      std::vector<bf16> v(n);
      RETURN_IF_ERROR(reader->Read(name, info.shape, DType::kBF16, v.data()));
      for (bf16 b : v) bits.push_back(b.bits);
      // And through the bf16 -> f32 conversion, which must be exact.
      std::vector<float> f(n);
      RETURN_IF_ERROR(reader->Read(name, info.shape, DType::kF32, f.data()));
      for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, &f[i], 4);
        if (u != static_cast<uint32_t>(v[i].bits) << 16) {
          return absl::InternalError(absl::StrCat(name, ": bf16 -> f32 changed element ", i));
        }
      }
    } else {
      std::vector<uint32_t> v(n);  // F32 bits or I32 values, both 4 bytes
      RETURN_IF_ERROR(reader->Read(name, info.shape, info.dtype, v.data()));
      for (uint32_t u : v) {
        if (info.dtype == DType::kI32) {
          bits.push_back(static_cast<int32_t>(u));
        } else {
          bits.push_back(u);
        }
      }
    }
    tensors[name] = {{"dtype", DTypeName(info.dtype)}, {"shape", info.shape}, {"bits", bits}};
  }
  Json out = {{"metadata", reader->Metadata()}, {"tensors", tensors}};
  std::printf("%s\n", out.dump(1).c_str());
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "dump" && argc == 3) return Dump(argv[2]);
  Known k = KnownTensors();
  SafetensorsWriter w;
  AddKnown(k, &w);
  if (cmd == "write" && argc == 3) return w.WriteFile(argv[2]);
  if (cmd == "write-sharded" && argc == 4) return w.WriteSharded(argv[2], std::atoll(argv[3]));
  return absl::InvalidArgumentError(
      "usage: safetensors_tool write <file> | write-sharded <dir> <max_bytes> | dump <path>");
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::Status st = ithaca::Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "safetensors_tool: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
