// The rules a topology view must meet, stated once. MakePlan, BuildCostModel (and so every cost
// model query), the runtimes' topologies, the Python bindings and the Python Topology's
// constructor (ranks and nodes) all check through here. Each error names the field as Python's
// planner.Topology spells it, the allowed values, the value given, and the TopologyView field.
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
std::string Allowed(int n, const char* (*name)(E), int skip = -1) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i == skip) continue;
    if (!s.empty()) s += ", ";
    s += name(static_cast<E>(i));
  }
  return s;
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
  const int net = int(LinkKind::kNet);
  JR_REQUIRE(int(t.intraLink) >= 0 && int(t.intraLink) < kNumLinkKinds && int(t.intraLink) != net,
             Code::kInvalidArgument, "topology.link joins the ranks of one node; allowed: ",
             Allowed(kNumLinkKinds, LinkName, net), "; got ",
             int(t.intraLink) == net ? "'net'" : std::to_string(int(t.intraLink)), " (intraLink)");
  JR_REQUIRE(int(t.interLink) >= 0 && int(t.interLink) < kNumLinkKinds, Code::kInvalidArgument,
             "topology.inter_link must be one of ", Allowed(kNumLinkKinds, LinkName),
             "; got value ", int(t.interLink), " (interLink)");
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
  // more than 2 nodes (NCCL's formula takes bwIntra up to 2 nodes) and on the host executor's
  // links across nodes (the socket bounds a ring there: the lower of the two). Elsewhere the
  // value is not read and may be 0, but it is never negative or infinite.
  JR_REQUIRE(std::isfinite(t.bwIntra) && t.bwIntra >= 0, Code::kInvalidArgument,
             "topology.bw_intra must be a finite value >= 0 GB/s, got ", t.bwIntra, " (bwIntra)");
  JR_REQUIRE(std::isfinite(t.bwInter) && t.bwInter >= 0, Code::kInvalidArgument,
             "topology.bw_inter must be a finite value >= 0 GB/s, got ", t.bwInter, " (bwInter)");
  JR_REQUIRE(t.nRanks == 1 || t.bwIntra > 0, Code::kInvalidArgument,
             "topology.bw_intra must be > 0 GB/s per channel when nranks > 1, got ", t.bwIntra,
             " (bwIntra)");
  if (t.nNodes > 2 || (t.nNodes > 1 && t.hostFifoLinks())) {
    JR_REQUIRE(t.bwInter > 0, Code::kInvalidArgument,
               "topology.bw_inter must be > 0 GB/s per channel when nnodes > 2, or nnodes > 1 "
               "with arch cpu over loopback or shm links; got ",
               t.bwInter, " (bwInter)");
  }
  JR_REQUIRE(t.workFifoDepth >= 2 * kMaxChannels && PowerOfTwo(t.workFifoDepth),
             Code::kInvalidArgument,
             "topology.work_fifo_depth must be a power of two >= ", 2 * kMaxChannels, ", got ",
             t.workFifoDepth, " (workFifoDepth)");
  return Status::Ok();
}

}  // namespace jax_rccl
