// LinkModel: how long a collective takes on the links of a GPU cluster, from its bytes, its
// algorithm's traffic and two link classes (docs/rehearsal.md has the formulas and sources):
//   - inside a node: NVLink through NVSwitch, every GPU to every other at `nvlink` bandwidth;
//   - across nodes: InfiniBand, one NIC per GPU (rail-optimized), at `ib` bandwidth.
// Each class is a bandwidth (bytes per second, one direction, per GPU, as NCCL achieves it: its
// "bus bandwidth") and a latency per algorithm step. The rehearsal communicator
// (rehearsal_comm.h) holds its stream this long for each collective.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

struct LinkClass {
  double bytes_per_s = 0;  // per GPU, one direction, as a collective achieves it
  double latency_s = 0;    // per algorithm step
};

struct LinkModel {
  std::string name;  // the preset's name, or "custom"
  LinkClass nvlink;  // inside a node
  LinkClass ib;      // across nodes
};

// Presets by name: "h100-sxm" and "h200-sxm" (NVLink 4 through NVSwitch, ConnectX-7 NDR 400 Gb/s
// per GPU; the same links on both), "zero" (no link time: the collectives' copies alone).
absl::StatusOr<LinkModel> LinkPreset(const std::string& name);
// The preset names, for messages and --help.
std::vector<std::string> LinkPresetNames();

// "h200-sxm" (a preset), or a preset followed by overrides, or overrides alone (on h100-sxm):
// "nvlink_gbps=360,nvlink_us=8,ib_gbps=45,ib_us=15" (GB/s are 1e9 bytes per second, per GPU,
// one direction). INVALID_ARGUMENT naming the part that is wrong.
absl::StatusOr<LinkModel> ParseLinkModel(const std::string& text);

// "h200-sxm (NVLink 360 GB/s, 8 us; IB 45 GB/s, 15 us)".
std::string LinkModelText(const LinkModel& link);

enum class CollectiveOp {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kAllToAll,
  kBroadcast,
  kBarrier,
  kSendRecv,
};
const char* CollectiveOpName(CollectiveOp op);

// Where a communicator's ranks are: `ranks` in all, spread over `nodes` nodes with
// `ranks_per_node` of them on each (nodes · ranks_per_node = ranks).
struct GroupShape {
  int ranks = 1;
  int nodes = 1;
  int ranks_per_node = 1;
};

// The modeled seconds of one collective of the group `g` whose per-rank payload is `bytes`: the
// output of an all-gather, the input of a reduce-scatter or an all-to-all, the buffer of an
// all-reduce or a broadcast (as Comm's signatures count them). 0 for a group of one.
//   ring all-gather / reduce-scatter: (n-1) steps, each rank moves (n-1)/n of `bytes`;
//   ring all-reduce: 2(n-1) steps, 2(n-1)/n of `bytes`;
//   all-to-all: one step; (g-1)/n of `bytes` goes over NVLink to the node's other ranks and
//   (n-g)/n over this rank's NIC to the other nodes, at the same time;
//   broadcast: pipelined, `bytes` once; barrier: one step;
//   send-recv: SendRecvSeconds between two ranks of the group on its slowest link (over a NIC
//   when the group spans nodes).
// Ring traffic inside one node runs at nvlink; a ring over several nodes crosses a NIC at each
// node boundary, and with one ring per NIC (NCCL's channels) it runs at min(nvlink,
// ranks_per_node · ib).
double CollectiveSeconds(const LinkModel& link, CollectiveOp op, int64_t bytes,
                         const GroupShape& g);

// The modeled seconds of Comm::SendRecv moving `bytes` each way between a rank and its peers: one
// step over NVLink, or over the NIC when `across_nodes` (SendRecvAcrossNodes); the send and the
// receive run at once, each direction at the link's one-way bandwidth.
double SendRecvSeconds(const LinkModel& link, int64_t bytes, bool across_nodes);

// Whether member `rank`'s exchange (send to `dst`, receive from `src`) is priced at the NIC;
// `node_of[m]` is member m's node. A shift around the group (dst = rank + k, src = rank - k,
// mod its size) is what every member does at once, as ring attention passes K/V on: each shift
// ends with its slowest hop, and the next waits for it, so it crosses when any member's hop
// crosses, even for a rank whose own peers share its node. Any other exchange crosses when this
// rank's own dst or src is on another node.
bool SendRecvAcrossNodes(const std::vector<int>& node_of, int rank, int dst, int src);

}  // namespace ithaca
