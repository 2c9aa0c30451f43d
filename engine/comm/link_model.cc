#include "engine/comm/link_model.h"

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/core/enum_names.h"

namespace ithaca {
namespace {

constexpr double kGB = 1e9;
constexpr double kUs = 1e-6;

// NVLink 4 through NVSwitch (H100 and H200 SXM: 18 links, 450 GB/s each way per GPU) reaches
// about 360 GB/s of bus bandwidth in NCCL's ring collectives; ConnectX-7 NDR (400 Gb/s = 50 GB/s
// per GPU) about 45 GB/s. docs/rehearsal.md gives the sources.
LinkModel Hopper(const std::string& name) {
  LinkModel m;
  m.name = name;
  m.nvlink = {360 * kGB, 3 * kUs};
  m.ib = {45 * kGB, 10 * kUs};
  return m;
}

double Seconds(const LinkClass& c, double bytes, double steps) {
  double t = steps * c.latency_s;
  if (bytes > 0 && c.bytes_per_s > 0) t += bytes / c.bytes_per_s;
  return t;
}

}  // namespace

std::vector<std::string> LinkPresetNames() { return {"h100-sxm", "h200-sxm", "zero"}; }

absl::StatusOr<LinkModel> LinkPreset(const std::string& name) {
  if (name == "h100-sxm" || name == "h200-sxm") return Hopper(name);
  if (name == "zero") {
    LinkModel m;
    m.name = name;
    return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("link \"", name, "\" is not a preset (",
                                                 absl::StrJoin(LinkPresetNames(), ", "), ")"));
}

absl::StatusOr<LinkModel> ParseLinkModel(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ',', absl::SkipWhitespace());
  if (parts.empty()) return absl::InvalidArgumentError("link: empty (a preset or key=value,...)");
  LinkModel m = Hopper("h100-sxm");
  size_t first = 0;
  if (parts[0].find('=') == std::string::npos) {
    ASSIGN_OR_RETURN(m, LinkPreset(parts[0]));
    first = 1;
  }
  // Each key sets one number of one class, in the unit its name says.
  const std::map<std::string, std::pair<double*, double>> keys = {
      {"nvlink_gbps", {&m.nvlink.bytes_per_s, kGB}},
      {"nvlink_us", {&m.nvlink.latency_s, kUs}},
      {"ib_gbps", {&m.ib.bytes_per_s, kGB}},
      {"ib_us", {&m.ib.latency_s, kUs}}};
  for (size_t i = first; i < parts.size(); ++i) {
    std::vector<std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    auto it = keys.find(kv[0]);
    if (kv.size() != 2 || it == keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "link: \"", parts[i], "\": expected a preset first, then key=value with a key of ",
          "nvlink_gbps, nvlink_us, ib_gbps, ib_us"));
    }
    double v = 0;
    if (!absl::SimpleAtod(kv[1], &v) || !(v >= 0) || v > 1e6) {
      return absl::InvalidArgumentError(
          absl::StrCat("link: ", kv[0], "=", kv[1], ": expected a number from 0 to 1e6"));
    }
    *it->second.first = v * it->second.second;
  }
  if (first < parts.size()) m.name = "custom";
  return m;
}

std::string LinkModelText(const LinkModel& link) {
  return absl::StrFormat("%s (NVLink %g GB/s, %g us; IB %g GB/s, %g us)", link.name,
                         link.nvlink.bytes_per_s / kGB, link.nvlink.latency_s / kUs,
                         link.ib.bytes_per_s / kGB, link.ib.latency_s / kUs);
}

const char* CollectiveOpName(CollectiveOp op) {
  static constexpr EnumName<CollectiveOp> kNames[] = {
      {CollectiveOp::kAllGather, "all_gather"}, {CollectiveOp::kReduceScatter, "reduce_scatter"},
      {CollectiveOp::kAllReduce, "all_reduce"}, {CollectiveOp::kAllToAll, "all_to_all"},
      {CollectiveOp::kBroadcast, "broadcast"},  {CollectiveOp::kBarrier, "barrier"},
      {CollectiveOp::kSendRecv, "send_recv"},
  };
  return NameOf(kNames, op);
}

double CollectiveSeconds(const LinkModel& link, CollectiveOp op, int64_t bytes,
                         const GroupShape& g) {
  const int n = g.ranks;
  if (n <= 1) return 0;
  const bool across = g.nodes > 1;
  // A ring is as fast as its slowest hop: NVLink inside the node, and across nodes the NICs of
  // the node's ranks, one ring each.
  LinkClass ring = link.nvlink;
  if (across) {
    ring.bytes_per_s = std::min(link.nvlink.bytes_per_s, g.ranks_per_node * link.ib.bytes_per_s);
    ring.latency_s = std::max(link.nvlink.latency_s, link.ib.latency_s);
  }
  const double b = static_cast<double>(bytes), share = double(n - 1) / n;
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
      return Seconds(ring, share * b, n - 1);
    case CollectiveOp::kAllReduce:
      return Seconds(ring, 2 * share * b, 2.0 * (n - 1));
    case CollectiveOp::kAllToAll: {
      const int on_node = std::min(g.ranks_per_node, n);
      const double nvl = Seconds(link.nvlink, b * (on_node - 1) / n, 1);
      const double ib = across ? Seconds(link.ib, b * (n - on_node) / n, 1) : 0.0;
      return std::max(nvl, ib);
    }
    case CollectiveOp::kBroadcast:
      return Seconds(ring, b, 1);
    case CollectiveOp::kBarrier:
      return Seconds(ring, 0, 1);
    case CollectiveOp::kSendRecv:
      return SendRecvSeconds(link, bytes, across);
  }
  return 0;
}

double SendRecvSeconds(const LinkModel& link, int64_t bytes, bool across_nodes) {
  return Seconds(across_nodes ? link.ib : link.nvlink, static_cast<double>(bytes), 1);
}

bool SendRecvAcrossNodes(const std::vector<int>& node_of, int rank, int dst, int src) {
  const int n = static_cast<int>(node_of.size());
  const int k = ((dst - rank) % n + n) % n;
  if (k != 0 && ((rank - src) % n + n) % n == k) {  // a shift by k: its slowest hop
    for (int m = 0; m < n; ++m) {
      if (node_of[m] != node_of[(m + k) % n]) return true;
    }
    return false;
  }
  return node_of[dst] != node_of[rank] || node_of[src] != node_of[rank];
}

}  // namespace ithaca
