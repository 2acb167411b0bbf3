// The cost model as data (after RCCL's src/graph/tuning.cc): latency and bandwidth tables per
// collective x algorithm x protocol built from the topology, thread counts and thresholds, and
// the one formula time = latency * steps + bytes / bandwidth. See docs/planner.md.
#pragma once

#include <string>

#include "ffi/core/status.h"
#include "ffi/planner/types.h"

namespace jax_rccl {

struct CostModel {
  // Per collective (Coll index < kNumCostColls), algorithm, protocol. A negative latency or a
  // zero bandwidth marks a combination that cannot run.
  // broadcast, reduce, all_gather, reduce_scatter, all_reduce
  static constexpr int kNumCostColls = 5;
  float latencyUs[kNumCostColls][kNumAlgos][kNumProtos] = {};
  float bandwidthGBs[kNumCostColls][kNumAlgos][kNumProtos] = {};
  // Ring bandwidth before protocols were disabled (RCCL's comm->ringbdw): what a Ring
  // combination falls back on when its bandwidth above is zero.
  float ringBackupGBs[kNumCostColls][kNumProtos] = {};
  int maxThreads[kNumAlgos][kNumProtos] = {};
  int64_t threadThresholds[kNumAlgos][kNumProtos] = {};
  int treeDepth = 0;  // channels[0].tree.depth
};

// ncclTopoTuneModel: fills the tables for a topology.
StatusOr<CostModel> BuildCostModel(const TopologyView& topo);

// ncclTopoGetAlgoTime: predicted microseconds for `nBytes` of `coll` with (algo, proto), or a
// negative value when the combination is not available. `backup` (may be null) is set when the
// combination may only serve as a fallback. `nChannels`: channels a tuner fixed (0: none); the
// NVIDIA-shaped models scale bandwidth by it.
float AlgoTime(const CostModel& model, const TopologyView& topo, Coll coll, Algo algo, Proto proto,
               int64_t nBytes, int numPipeOps, bool* backup, int nChannels = 0);

// Why AlgoTime gives (algo, proto) no time for `nBytes` of `coll` on this topology, in a few
// words ("LL128 is not enabled on this topology"); empty when the combination can run.
std::string UnavailableReason(const CostModel& model, const TopologyView& topo, Coll coll,
                              Algo algo, Proto proto, int64_t nBytes);

// A readable dump of the tables (explain and docs).
std::string DescribeCostModel(const CostModel& model, const TopologyView& topo);

}  // namespace jax_rccl
