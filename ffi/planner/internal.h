// Internal planner state and the functions each planner source file implements. Not included
// outside ffi/planner/.
//
//   plan.cc           intake (ArgsCheck, taskAppend, collCmp), the planning loop, finishPlan
//   select.cc         getTunerInfo, topoGetAlgoInfo, getChannnelThreadInfo, getPatternInfo,
//                     computeCollWorkFunc (DevFuncId), ncclInfoSetDerived
//   chunk.cc          computeCollChunkInfo, computeCollAlignCount, computeCollLastChunkInfo,
//                     computeCollSteps, initCollWorkElem
//   schedule_coll.cc  scheduleCollTasksToPlan, addCBDCollToPlan, addTunedCollToPlan,
//                     getCBDCollnChannel, appendWorkElemColl
//   schedule_p2p.cc   the p2p schedule, channel mapping, scheduleP2pTasksToPlan, addP2pToPlan,
//                     appendWorkElemP2p, finishWorkP2p, calcP2pChunkSize
//   layout.cc         uploadWork's layouts (persistent and FIFO)
//   proxy.cc          initCollProxyOp, the p2p proxy op (ncclProxyComputeP2p), addProxyOpIfNeeded
//                     (ncclProxySaveOp's inquiry), uploadProxyOps' order
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "ffi/planner/planner.h"

namespace jax_rccl {

// Read-only inputs shared by every step.
struct PlanContext {
  const TopologyView& topo;
  const CostModel& model;
  const Tuning& tuning;
  const PlannerParams& params;
  int rank;
  uint64_t opCount;
};

// A collective as the planner carries it (ncclInfo).
struct CollInfo {
  int index = 0;  // the task's slot
  Coll coll = Coll::kAllReduce;
  DataType dtype = DataType::kFloat32;
  int32_t op = kSum;
  DevRedOpFull opFull;
  uint64_t count = 0;
  int root = 0;
  // ncclInfoSetDerived
  int64_t nBytes = 0;
  int64_t workBytes = 0;
  int chunkSteps = 0;
  int sliceSteps = 0;
  // the choice
  Algo algo = Algo::kUndef;
  Proto proto = Proto::kUndef;
  int nChannels = 0;
  int nThreads = 0;
  Pattern pattern = Pattern::kRing;
  int funcIndex = -1;
  bool userTuned = false;
  int64_t aggnBytes = 0;
  float predictedUs = 0;
  // Why the choice is not the cost model's pick among the allowed pairs (a fallback or one of
  // RCCL's topology rules); empty when it is.
  std::string choiceNote;
  // computeCollChunkInfo
  int64_t chunkSize = 0;
  int64_t chunkCount = 0;
  int stepSize = 0;
  // where it went
  int kernel = -1;
  int channelsUsed = 0;
};

// A send or a receive (ncclTaskP2p).
struct P2pInfo {
  int index = 0;  // the task's slot
  int peer = 0;
  bool isSend = false;
  DataType dtype = DataType::kInt8;
  uint64_t count = 0;
  int64_t bytes = 0;
  int64_t offset = 0;  // bytes already scheduled (advanced chunk by chunk)
  int chunk = 0;
  Proto firstProto = Proto::kUndef;
  int kernel = -1;
  int channelsUsed = 0;
};

// The group being planned (ncclTasks).
struct GroupState {
  std::vector<CollInfo> colls;  // storage; queues hold indices into it
  std::deque<int> collQueue;    // sorted by collCmp
  std::deque<int> collCBDQueue;
  std::deque<int> collTunedQueue;
  std::vector<P2pInfo> p2ps;               // storage
  std::vector<std::deque<int>> sendQueue;  // per peer, indices into p2ps
  std::vector<std::deque<int>> recvQueue;
  int nTasksColl = 0;
  int nTasksP2p = 0;
  int64_t workBytesTotal = 0;
  int usableChannels = 0;
  std::vector<int> p2pSendOrder;
  std::vector<int> p2pRecvOrder;
};

// ---- select.cc ----
// ncclInfoSetDerived: nBytes, chunkSteps, sliceSteps.
void SetDerived(CollInfo* info, int nRanks);
// getTunerInfo: resets the choice, asks the tuner; marks userTuned when it fixed nChannels.
Status GetTunerInfo(const PlanContext& ctx, CollInfo* info, int numPipeOps);
// topoGetAlgoInfo: the argmin over allowed (algo, proto) of AlgoTime, with the backup choice.
Status GetAlgoInfo(const PlanContext& ctx, CollInfo* info, int numPipeOps);
// getChannnelThreadInfo.
Status GetChannelThreadInfo(const PlanContext& ctx, CollInfo* info);
// getPatternInfo.
Status GetPatternInfo(CollInfo* info);
// computeCollWorkFunc: the device function index of (coll, devop, dtype, algo, proto).
Status ComputeWorkFunc(CollInfo* info);
int DevFuncId(Coll coll, DevRedOp op, DataType dtype, Algo algo, Proto proto);
int DevFuncIdP2p();
int NumDevFuncs();

// ---- chunk.cc ----
Status ComputeChunkInfo(const PlanContext& ctx, CollInfo* info, int64_t nBytes, int nChannels);
// Needs ctx for the warp size (NCCL_SIMPLE_ALIGNMENT = warpSize * 8 * 16 bytes).
int64_t ComputeAlignCount(const PlanContext& ctx, const CollInfo& info);
int64_t ComputeLastChunkCount(const PlanContext& ctx, const CollInfo& info, uint64_t workCount,
                              int64_t alignCount);
uint32_t ComputeSteps(const PlanContext& ctx, const CollInfo& info, uint64_t workCount);
WorkElemColl InitCollWorkElem(const PlanContext& ctx, const CollInfo& info);

// ---- schedule_coll.cc ----
// Appends an element to channel `c`, fusing into the tail work when allowed.
void AppendWorkElemColl(KernelPlan* kp, int c, int funcIndex, const WorkElemColl& elem);
// scheduleCollTasksToPlan. `nWorkBudget` counts works still allowed in this kernel.
Status ScheduleCollTasks(const PlanContext& ctx, GroupState* g, KernelPlan* kp, int kernelIndex,
                         int* nWorkBudget);

// ---- schedule_p2p.cc ----
// The per-step peer order (p2pSendOrder / p2pRecvOrder) for `rank` of the topology.
void ComputeP2pSchedule(const TopologyView& topo, int rank, std::vector<int>* sendOrder,
                        std::vector<int>* recvOrder);
// ncclChannelCompute: the channel of the `chunk`-th piece to/from `peer`.
int P2pChannel(const TopologyView& topo, int rank, int peer, int chunk, bool isSend);
int64_t CalcP2pChunkSize(int64_t totalSize, int minChannels, int maxChannels, int64_t minSize,
                         int64_t maxSize);
void FinishWorkP2p(Work* work, int warpSize);
// scheduleP2pTasksToPlan.
Status ScheduleP2pTasks(const PlanContext& ctx, GroupState* g, KernelPlan* kp, int kernelIndex,
                        int* nWorkBudget);

// ---- proxy.cc ----
// initCollProxyOp: the proxy op of one part of a collective on channel `channelId`, `nsteps`
// from ComputeSteps of the part; no peers yet.
ProxyOp InitCollProxyOp(const PlanContext& ctx, const CollInfo& info, int channelId,
                        uint64_t opCount, uint32_t nsteps);
// The proxy op of one p2p piece of `bytes` (ncclProxyComputeP2p's fields and step count) with
// the element's chunk size and connection; opCount is set when the piece has found its work.
ProxyOp InitP2pProxyOp(const P2pInfo& task, int channelId, Proto proto, int64_t bytes,
                       int64_t chunkSize, int connIndex);
// addProxyOpIfNeeded: fills in the network connections the op's pattern uses on its channel
// (ncclProxySaveOp's inquiry, with "has a proxy" read as "the peer is on another node") and
// appends it to the channel's queue when there is one. Returns whether it was added.
bool AddProxyOpIfNeeded(const PlanContext& ctx, KernelPlan* kp, ProxyOp op);

// ---- plan.cc ----
// finishPlan: channel mask/count/ubound, isLast on each channel's tail work, p2p work finishing,
// threads per block.
void FinishKernelPlan(const PlanContext& ctx, KernelPlan* kp);

inline int64_t DivUp(int64_t x, int64_t y) {
  return (x + y - 1) / y;
}
inline int64_t AlignUp(int64_t x, int64_t a) {
  return DivUp(x, a) * a;
}

}  // namespace jax_rccl
