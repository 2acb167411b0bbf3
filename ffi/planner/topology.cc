// The rules a topology view must meet, stated once. MakePlan, BuildCostModel (and so every cost
// model query), the runtimes' topologies, the Python bindings and the Python Topology's
// constructor (ranks and nodes) all check through here. Each error names the field as Python's
// planner.Topology spells it, the allowed values, the value given, and the TopologyView field.
#include <algorithm>
#include <cmath>
#include <string>

#include "ffi/planner/types.h"
#include "ffi/planner/work.h"

namespace jax_rccl {
namespace {

bool PowerOfTwo(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

// The names allowed for a field holding one of n enum values, "a, b, c".
template <typename E>
std::string Allowed(int n, const char* (*name)(E), int skip = -1, int first = 0) {
  std::string s;
  for (int i = first; i < n; ++i) {
    if (i == skip) continue;
    if (!s.empty()) s += ", ";
    s += name(static_cast<E>(i));
  }
  return s;
}

// A link value as an error quotes it: its name where it has one, else the number.
std::string LinkText(int v) {
  return v >= 0 && v < kNumLinkKinds ? detail::StrCat("'", LinkName(LinkKind(v)), "'")
                                     : std::to_string(v);
}

}  // namespace

Status ValidateRanksAndNodes(int nRanks, int nNodes) {
  JR_REQUIRE(nRanks >= 1, Code::kInvalidArgument, "topology.nranks must be >= 1, got ", nRanks,
             " (nRanks)");
  JR_REQUIRE(nNodes >= 1 && nNodes <= nRanks && nRanks % nNodes == 0, Code::kInvalidArgument,
             "topology.nnodes must be in 1..nranks and divide nranks (", nRanks,
             "): every node holds as many ranks; got ", nNodes, " (nNodes)");
  return Status::Ok();
}

Status ValidateTopology(const TopologyView& t) {
  JR_CHECK(ValidateRanksAndNodes(t.nRanks, t.nNodes));
  JR_REQUIRE(int(t.arch) >= 0 && int(t.arch) < kNumArchs, Code::kInvalidArgument,
             "topology.arch must be one of ", Allowed(kNumArchs, ArchName), "; got value ",
             int(t.arch), " (arch)");
  const int intra = int(t.intraLink);
  JR_REQUIRE(intra >= 0 && intra < kFirstInterNodeLink, Code::kInvalidArgument,
             "topology.link joins the ranks of one node; allowed: ",
             Allowed(kFirstInterNodeLink, LinkName), "; got ", LinkText(intra), " (intraLink)");
  const int inter = int(t.interLink);
  JR_REQUIRE(inter >= kFirstInterNodeLink && inter < kNumLinkKinds, Code::kInvalidArgument,
             "topology.inter_link joins nodes; allowed: ",
             Allowed(kNumLinkKinds, LinkName, -1, kFirstInterNodeLink), "; got ", LinkText(inter),
             " (interLink)");
  JR_REQUIRE(t.nChannels >= 1 && t.nChannels <= kMaxChannels, Code::kInvalidArgument,
             "topology.nchannels must be in 1..", kMaxChannels, ", got ", t.nChannels,
             " (nChannels)");
  JR_REQUIRE(t.p2pnChannels <= kMaxChannels && PowerOfTwo(t.p2pnChannels), Code::kInvalidArgument,
             "topology.p2p_nchannels must be a power of two in 1..", kMaxChannels, ", got ",
             t.p2pnChannels, " (p2pnChannels)");
  JR_REQUIRE(t.p2pnChannelsPerPeer <= t.p2pnChannels && PowerOfTwo(t.p2pnChannelsPerPeer),
             Code::kInvalidArgument,
             "topology.p2p_nchannels_per_peer must be a power of two in 1..p2p_nchannels (",
             t.p2pnChannels, "), got ", t.p2pnChannelsPerPeer, " (p2pnChannelsPerPeer)");
  for (int p = 0; p < kNumProtos; ++p) {
    JR_REQUIRE(t.buffSizes[p] >= 0 && t.buffSizes[p] % kSteps == 0, Code::kInvalidArgument,
               "topology.buff_sizes[", ProtoName(Proto(p)), "] must be a non-negative multiple of ",
               kSteps, ", got ", t.buffSizes[p], " (buffSizes)");
  }
  JR_REQUIRE(t.buffSizes[int(Proto::kSimple)] > 0, Code::kInvalidArgument,
             "topology.buff_sizes[simple] must be > 0 (every collective can fall back on Simple), "
             "got 0 (buffSizes)");
  JR_REQUIRE(t.p2pChunkSize >= 8, Code::kInvalidArgument,
             "topology.p2p_chunk_size must be >= 8 bytes, got ", t.p2pChunkSize, " (p2pChunkSize)");
  // Bandwidths are required exactly where the cost model reads them (cost_model.cc): bwIntra for
  // every topology of more than one rank (a one-rank plan is a copy, never costed); bwInter on
  // more than 2 nodes (NCCL's formula takes bwIntra up to 2 nodes), on the host executor's links
  // across nodes and on socket links (the socket bounds a ring there: the lower of the two).
  // Elsewhere the value is not read and may be 0, but it is never negative or infinite.
  JR_REQUIRE(std::isfinite(t.bwIntra) && t.bwIntra >= 0, Code::kInvalidArgument,
             "topology.bw_intra must be a finite value >= 0 GB/s, got ", t.bwIntra, " (bwIntra)");
  JR_REQUIRE(std::isfinite(t.bwInter) && t.bwInter >= 0, Code::kInvalidArgument,
             "topology.bw_inter must be a finite value >= 0 GB/s, got ", t.bwInter, " (bwInter)");
  JR_REQUIRE(t.nRanks == 1 || t.bwIntra > 0, Code::kInvalidArgument,
             "topology.bw_intra must be > 0 GB/s per channel when nranks > 1, got ", t.bwIntra,
             " (bwIntra)");
  if (t.nNodes > 2 || (t.nNodes > 1 && (t.hostFifoLinks() || t.socketNet()))) {
    JR_REQUIRE(t.bwInter > 0, Code::kInvalidArgument,
               "topology.bw_inter must be > 0 GB/s per channel when nnodes > 2, or nnodes > 1 "
               "with arch cpu over loopback or shm links or with inter_link 'socket'; got ",
               t.bwInter, " (bwInter)");
  }
  JR_REQUIRE(t.workFifoDepth >= 2 * kMaxChannels && PowerOfTwo(t.workFifoDepth),
             Code::kInvalidArgument,
             "topology.work_fifo_depth must be a power of two >= ", 2 * kMaxChannels, ", got ",
             t.workFifoDepth, " (workFifoDepth)");
  return Status::Ok();
}

// Per channel the rate the network proxy's sockets give between two hosts (GB/s): one H100 with
// 2 and 4 processes split into two faked hosts moved 12-19 GB/s across at 256 MB on the 32
// channels of a group of up to 4 ranks (docs/benchmarks.md, GPU groups across hosts).
constexpr float kGpuSocketBwGBs = 0.5f;

TopologyView GpuGroupTopology(Arch arch, int nRanks, int nNodes, int64_t nchannels,
                              int64_t buffsize, int64_t netBuffsize, bool ll128) {
  TopologyView t;
  t.nRanks = nRanks;
  t.nNodes = 1;
  t.arch = arch;
  t.intraLink = IsAmd(arch) ? LinkKind::kXgmi : LinkKind::kNvlink;
  t.interLink = LinkKind::kSocket;
  t.bwIntra = 30.0f;  // GB/s per channel (the cost model's NVLink-class figure)
  // Channels: each is one block streaming its share, and a block's rate bounds a channel's (two
  // H200s over NV18: 16 channels gave 140 GB/s busbw at 128 MB, 32 gave 181). A region holds a
  // connection from every rank on every channel (nChannels x nRanks x 4.7 MiB), so groups of more
  // than 4 ranks keep 16.
  const int ch =
      nchannels > 0 ? static_cast<int>(std::min<int64_t>(nchannels, 32)) : (nRanks <= 4 ? 32 : 16);
  t.nChannels = ch;
  int p2p = 1;  // the planner's p2p channel counts are powers of two
  while (p2p * 2 <= ch) p2p *= 2;
  t.p2pnChannels = p2p;
  t.p2pnChannelsPerPeer = std::min(2, p2p);
  for (int p = 0; p < kNumProtos; ++p) t.buffSizes[p] = kGpuBuffSizes[p];
  t.buffSizes[static_cast<int>(Proto::kSimple)] = buffsize;
  t.p2pChunkSize = 131072;
  // LL128 where the device code has it (NVIDIA); the handlers leave it to explicit protocol
  // settings (ffi/handlers/gpu.cc: GpuBackend::Configure).
  t.ll128Enabled = ll128;
  // workFifoDepth keeps its default: the runtime's plans are persistent (no FIFO budget).
  t.directPeers = false;
  if (nNodes > 1) {
    t.nNodes = nNodes;
    t.bwInter = kGpuSocketBwGBs;
    // The windows across hosts stream the Simple steps through host memory and TCP: smaller
    // steps than within a host keep more of them moving (docs/benchmarks.md, GPU groups across
    // hosts). The connections within a host of such a group take the same steps (one geometry).
    t.buffSizes[static_cast<int>(Proto::kSimple)] = netBuffsize;
  }
  return t;
}

}  // namespace jax_rccl
