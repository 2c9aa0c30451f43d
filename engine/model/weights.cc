#include "engine/model/weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "engine/core/file_util.h"

namespace ithaca {

namespace {

// SplitMix64's finalizer: a counter-based generator, so any element's value is computed on its
// own, in any order and on any thread.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Elements [begin, end) (begin even) of a unit's normal draws: pair p of the unit's flat index
// gives elements 2p and 2p + 1, by Marsaglia's polar method on the halves of draws 64p, 64p + 1,
// ... of the unit's stream (a pair is accepted with probability π/4, so 64 tries never run out).
// Single precision throughout: ~3.5x the rate of std::normal_distribution<float> on mt19937_64.
void Normals(uint64_t key, int64_t begin, int64_t end, float sigma, float* out) {
  for (int64_t j = begin; j < end; j += 2) {
    uint64_t counter = key + static_cast<uint64_t>(j / 2) * 64;
    float x, y, s;
    do {
      const uint64_t h = Mix(counter++);
      x = static_cast<float>(static_cast<int32_t>(h >> 32)) * (1.f / 2147483648.f);
      y = static_cast<float>(static_cast<int32_t>(h & 0xffffffffull)) * (1.f / 2147483648.f);
      s = x * x + y * y;
    } while (s >= 1.f || s == 0.f);
    const float f = sigma * std::sqrt(-2.f * std::log(s) / s);
    out[j - begin] = x * f;
    if (j + 1 < end) out[j + 1 - begin] = y * f;
  }
}

}  // namespace

std::vector<float> RandomUnitWeights(const ParamLayout& layout, int u, uint64_t seed) {
  std::vector<float> flat(layout.units()[u].numel);
  RandomUnitWeightsInto(layout, u, seed, flat.data());
  return flat;
}

void RandomUnitWeightsInto(const ParamLayout& layout, int u, uint64_t seed, float* flat) {
  const ParamUnit& unit = layout.units()[u];
  const uint64_t key = Mix(Mix(seed) ^ (static_cast<uint64_t>(u) * 0x100000001b3ull + 1));
  // Every matrix element is draw number (its index in the unit) of the unit's stream; pieces of
  // 1M elements go to every core (a Llama-3-8B init is 8 billion draws: minutes on one core).
  constexpr int64_t kPiece = int64_t{1} << 20;
  struct Range {
    int64_t begin, end;
  };
  std::vector<Range> pieces;
  for (const ParamEntry& e : unit.entries) {
    const int64_t n = NumElements(e.shape);
    if (!e.is_matrix) {  // norm weights 1, biases 0
      std::fill(flat + e.offset, flat + e.offset + n, e.is_bias ? 0.f : 1.f);
      continue;
    }
    for (int64_t b = e.offset; b < e.offset + n; b += kPiece) {
      pieces.push_back({b, std::min(e.offset + n, b + kPiece)});
    }
  }
  auto draw = [&](const Range& r) {
    // Pairs start at even indices: an odd start takes the second half of its pair.
    const int64_t even = r.begin & ~int64_t{1};
    if (even < r.begin) {
      float two[2];
      Normals(key, even, even + 2, 0.02f, two);
      flat[r.begin] = two[1];
      if (r.begin + 1 < r.end) Normals(key, r.begin + 1, r.end, 0.02f, flat + r.begin + 1);
    } else {
      Normals(key, r.begin, r.end, 0.02f, flat + r.begin);
    }
  };
  const int threads = static_cast<int>(
      std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), pieces.size()));
  if (threads <= 1) {
    for (const Range& r : pieces) draw(r);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < pieces.size(); i = next++) draw(pieces[i]);
    });
  }
  for (std::thread& t : pool) t.join();
}

HostWeights RandomWeights(const ParamLayout& layout, uint64_t seed) {
  HostWeights w;
  for (int u = 0; u < layout.num_units(); ++u) w.push_back(RandomUnitWeights(layout, u, seed));
  return w;
}

absl::StatusOr<std::vector<float>> ReadUnitWeights(const ParamLayout& layout,
                                                   const SafetensorsReader& reader, int u) {
  std::vector<float> flat(layout.units()[u].numel);
  RETURN_IF_ERROR(ReadUnitWeightsInto(layout, reader, u, flat.data()));
  return flat;
}

absl::Status ReadUnitWeightsInto(const ParamLayout& layout, const SafetensorsReader& reader, int u,
                                 float* out) {
  for (const ParamEntry& e : layout.units()[u].entries) {
    RETURN_IF_ERROR(reader.Read(e.hf_name, e.shape, DType::kF32, out + e.offset));
  }
  return absl::OkStatus();
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
