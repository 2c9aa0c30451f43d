#include "server/node.h"

#include <stdio.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/core/units.h"

namespace ithaca {
namespace {

// "index, uuid, name, memory MiB" lines from nvidia-smi; empty when it is not there.
std::vector<NodeDevice> QueryNvidiaSmi() {
  std::vector<NodeDevice> out;
  FILE* p = popen(
      "nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits "
      "2>/dev/null",
      "r");
  if (p == nullptr) return out;
  char line[512];
  while (fgets(line, sizeof(line), p)) {
    std::vector<std::string> f = absl::StrSplit(absl::StripAsciiWhitespace(line), ", ");
    NodeDevice d;
    int64_t mib = 0;
    if (f.size() == 4 && absl::SimpleAtoi(f[0], &d.index) && absl::SimpleAtoi(f[3], &mib)) {
      d.uuid = f[1];
      d.name = f[2];
      d.memory_bytes = mib << 20;
      out.push_back(d);
    }
  }
  pclose(p);
  return out;
}

}  // namespace

Node DetectNode(const NodeOptions& options) {
  Node node;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  node.hostname = host;
  node.host_memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  std::vector<NodeDevice> found;
  int gpus = options.gpus;
  if (gpus != 0) found = QueryNvidiaSmi();
  if (gpus == NodeOptions::kAutoGpus) gpus = static_cast<int>(found.size());
  node.gpu = gpus > 0;
  if (node.gpu) {
    const int64_t fallback =
        static_cast<int64_t>((options.gpu_memory_gib > 0 ? options.gpu_memory_gib : 80) * kGiB);
    for (int i = 0; i < gpus; ++i) {
      NodeDevice d;
      if (i < static_cast<int>(found.size())) {
        d = found[i];
        if (options.gpu_memory_gib > 0) d.memory_bytes = fallback;
      } else {
        d.index = i;
        d.name = "GPU (not detected)";
        d.memory_bytes = fallback;
      }
      node.devices.push_back(d);
    }
  } else {
    const int slots = options.cpu_slots > 0 ? options.cpu_slots : 1;
    for (int i = 0; i < slots; ++i) {
      NodeDevice d;
      d.index = i;
      d.name = "cpu slot";
      d.memory_bytes = node.host_memory_bytes;
      node.devices.push_back(d);
    }
  }
  return node;
}

}  // namespace ithaca

namespace ithaca {

absl::StatusOr<Node> HardwareNode(const std::string& text) {
  constexpr double kH100Gib = 80, kH200Gib = 150109880320.0 / kGiB;
  struct Preset {
    const char* name;
    int gpus;
    double gpu_gib, host_gib;
  };
  static const Preset kPresets[] = {{"h100x1", 1, kH100Gib, 256},
                                    {"h100x8", 8, kH100Gib, 2048},
                                    {"h200x1", 1, kH200Gib, 256},
                                    {"h200x8", 8, kH200Gib, 2048}};
  std::vector<std::string> parts = absl::StrSplit(text, ',', absl::SkipWhitespace());
  if (parts.empty()) {
    return absl::InvalidArgumentError(
        "--hardware: empty (h100x1, h100x8, h200x1, h200x8, or gpus=N,gpu_gib=G,host_gib=H)");
  }
  int gpus = 0;
  double gpu_gib = 0, host_gib = 0;
  std::string name = text;
  size_t first = 0;
  if (parts[0].find('=') == std::string::npos) {
    const Preset* found = nullptr;
    for (const Preset& p : kPresets) {
      if (parts[0] == p.name) found = &p;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--hardware: \"", parts[0], "\" is not a preset (h100x1, h100x8, h200x1, h200x8)"));
    }
    gpus = found->gpus;
    gpu_gib = found->gpu_gib;
    host_gib = found->host_gib;
    first = 1;
  }
  for (size_t i = first; i < parts.size(); ++i) {
    std::vector<std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    double v = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &v) || !(v > 0) || v > (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hardware: \"", parts[i],
                       "\": expected gpus=N, gpu_gib=G or host_gib=H, a number above 0"));
    }
    if (kv[0] == "gpus" && v == static_cast<int>(v) && v <= 4096) {
      gpus = static_cast<int>(v);
    } else if (kv[0] == "gpu_gib") {
      gpu_gib = v;
    } else if (kv[0] == "host_gib") {
      host_gib = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--hardware: \"", parts[i], "\": the keys are gpus (a whole number), gpu_gib, host_gib"));
    }
  }
  if (gpus == 0 || gpu_gib == 0 || host_gib == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hardware ", text, ": give gpus, gpu_gib and host_gib (or start with a preset)"));
  }
  Node node;
  node.gpu = true;
  node.hostname = absl::StrCat("--hardware ", name);
  node.host_memory_bytes = static_cast<int64_t>(host_gib * kGiB);
  for (int i = 0; i < gpus; ++i) {
    NodeDevice d;
    d.index = i;
    d.name = name;
    d.memory_bytes = static_cast<int64_t>(gpu_gib * kGiB);
    node.devices.push_back(d);
  }
  return node;
}

}  // namespace ithaca
