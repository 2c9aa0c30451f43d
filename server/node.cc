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
