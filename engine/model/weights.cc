#include "engine/model/weights.h"

#include <random>

#include "engine/core/file_util.h"

namespace ithaca {

std::vector<float> RandomUnitWeights(const ParamLayout& layout, int u, uint64_t seed) {
  const ParamUnit& unit = layout.units()[u];
  std::vector<float> flat(unit.numel);
  std::mt19937_64 rng(seed * 1000003 + u);
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (const ParamEntry& e : unit.entries) {
    const int64_t n = NumElements(e.shape);
    for (int64_t i = 0; i < n; ++i) flat[e.offset + i] = e.is_matrix ? normal(rng) : e.is_bias ? 0.f : 1.f;
  }
  return flat;
}

HostWeights RandomWeights(const ParamLayout& layout, uint64_t seed) {
  HostWeights w;
  for (int u = 0; u < layout.num_units(); ++u) w.push_back(RandomUnitWeights(layout, u, seed));
  return w;
}

absl::StatusOr<std::vector<float>> ReadUnitWeights(const ParamLayout& layout,
                                                   const SafetensorsReader& reader, int u) {
  const ParamUnit& unit = layout.units()[u];
  std::vector<float> flat(unit.numel);
  for (const ParamEntry& e : unit.entries) {
    RETURN_IF_ERROR(reader.Read(e.hf_name, e.shape, DType::kF32, flat.data() + e.offset));
  }
  return flat;
}

absl::StatusOr<HostWeights> ReadWeights(const ParamLayout& layout,
                                        const SafetensorsReader& reader) {
  HostWeights w;
  for (int u = 0; u < layout.num_units(); ++u) {
    ASSIGN_OR_RETURN(std::vector<float> flat, ReadUnitWeights(layout, reader, u));
    w.push_back(std::move(flat));
  }
  return w;
}

absl::Status WriteHfCheckpoint(const std::string& dir, const LlamaConfig& cfg,
                               const ParamLayout& layout, const std::vector<const float*>& units,
                               DType file_dtype, int64_t max_shard_bytes) {
  RETURN_IF_ERROR(MakeDirs(dir));
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  for (size_t u = 0; u < layout.units().size(); ++u) {
    for (const ParamEntry& e : layout.units()[u].entries) {
      writer.Add(e.hf_name, DType::kF32, e.shape, units[u] + e.offset, file_dtype);
    }
  }
  RETURN_IF_ERROR(writer.WriteSharded(dir, max_shard_bytes));
  return WriteFileAtomic(dir + "/config.json", ConfigToJson(cfg));
}

}  // namespace ithaca
