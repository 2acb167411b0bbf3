// Task intake (ArgsCheck, taskAppend, collCmp), the planning loop (ncclLaunchPrepare's plan
// building) and plan finishing (finishPlan), after RCCL src/enqueue.cc and src/misc/argcheck.cc.
#include <algorithm>
#include <climits>

#include "ffi/planner/internal.h"

namespace jax_rccl {

int KernelPlan::nWork() const {
  int n = 0;
  for (int c = 0; c < channelUbound; ++c) n += channels[c].nWork();
  return n;
}

namespace {

// collCmp: a task compares greater than another by (collective, datatype, device op, count); it
// never reports equality. The sorted insert walks past queued tasks that compare greater than the
// new one, so the queue runs in descending order and a new task goes before its equals.
bool CollGreater(const CollInfo& a, const CollInfo& b) {
  if (a.coll != b.coll) return a.coll > b.coll;
  if (a.dtype != b.dtype) return a.dtype > b.dtype;
  if (a.opFull.op != b.opFull.op) return a.opFull.op > b.opFull.op;
  return a.count > b.count;
}

// The order RCCL's sorted inserts produce, in one sort: descending keys, and among equal keys the
// later task first (an insert goes before its equals).
void SortCollQueue(GroupState* g) {
  std::vector<int> order(g->colls.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(order.size() - 1 - i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return CollGreater(g->colls[a], g->colls[b]); });
  g->collQueue.assign(order.begin(), order.end());
}

// ArgsCheck (RCCL src/misc/argcheck.cc) plus the limits of our work element fields.
Status ArgsCheck(const PlanRequest& req, int index, const TaskDesc& t) {
  const int nRanks = req.topo.nRanks;
  const char* name = CollName(t.coll);
  JR_REQUIRE(t.coll != Coll::kSendRecv && int(t.coll) >= 0 && int(t.coll) < kNumColls,
             Code::kInvalidArgument, "tasks[", index, "]: invalid collective ", int(t.coll));
  const bool p2p = t.coll == Coll::kSend || t.coll == Coll::kRecv;
  if (p2p) {
    JR_REQUIRE(t.peer >= 0 && t.peer < nRanks, Code::kInvalidArgument, "tasks[", index, "] (", name,
               "): invalid peer ", t.peer, " (peer must be in 0..", nRanks - 1, ")");
  } else if (t.coll == Coll::kBroadcast || t.coll == Coll::kReduce) {
    JR_REQUIRE(t.root >= 0 && t.root < nRanks, Code::kInvalidArgument, "tasks[", index, "] (", name,
               "): invalid root ", t.root, " (root must be in 0..", nRanks - 1, ")");
  }
  JR_REQUIRE(int(t.dtype) >= 0 && int(t.dtype) < kNumDataTypes, Code::kInvalidArgument, "tasks[",
             index, "] (", name, "): invalid dtype ", int(t.dtype));
  JR_REQUIRE(t.op >= 0 && t.op <= kMaxRedOp, Code::kInvalidArgument, "tasks[", index, "] (", name,
             "): invalid reduction op ", t.op);
  if (t.op >= kNumRedOps) {
    JR_REQUIRE(req.userOps != nullptr, Code::kInvalidArgument, "tasks[", index, "] (", name,
               "): reduction op ", t.op, " is a user op handle but no RedOpTable was given");
    auto user = req.userOps->Lookup(t.op);
    if (!user.ok()) {
      Status s(user.status().code(),
               detail::StrCat("tasks[", index, "] (", name, "): ", user.status().message()));
      JR_CHECK(s);
    }
  }
  // Our work elements hold counts in 39 bits (bytes for all_gather/broadcast).
  const uint64_t bytes = t.count * DataTypeSize(t.dtype);
  JR_REQUIRE(t.count < (uint64_t(1) << 39) && bytes < (uint64_t(1) << 39), Code::kInvalidArgument,
             "tasks[", index, "] (", name, "): count ", t.count, " is too large (at most 2^39 - 1 ",
             "elements and bytes)");
  return Status::Ok();
}

// RCCL's maximum over all P2P tasks of a group is a 16-bit slot here.
constexpr size_t kMaxTasks = 1 << 16;

}  // namespace

void FinishKernelPlan(const PlanContext& ctx, KernelPlan* kp) {
  int channelUbound = 0;
  int channelCount = 0;
  ChannelMask mask{};
  for (int c = 0; c < kMaxChannels; ++c) {
    ChannelPlan& ch = kp->channels[c];
    if (ch.works.empty()) continue;
    channelUbound = c + 1;
    channelCount += 1;
    mask.masks[c / 64] |= uint64_t(1) << (c % 64);
    Work& tail = ch.works.back();
    tail.header.isLast = 1;
    if (tail.header.type == kWorkTypeP2p) FinishWorkP2p(&tail, ctx.topo.warpSize());
  }
  bool hasProxyOps = false;
  for (const ChannelPlan& ch : kp->channels) hasProxyOps |= !ch.proxyOps.empty();
  kp->hasProxyOps = hasProxyOps;
  kp->channelUbound = channelUbound;
  kp->channelCount = channelCount;
  kp->channelMask = mask;
  kp->threadPerBlock = std::max(kp->threadPerBlock, 3 * ctx.topo.warpSize());
}

StatusOr<Plan> MakePlan(const PlanRequest& req) {
  JR_CHECK(ValidateTopology(req.topo));
  JR_REQUIRE(req.rank >= 0 && req.rank < req.topo.nRanks, Code::kInvalidArgument,
             "rank must be in 0..", req.topo.nRanks - 1, ", got ", req.rank);
  JR_REQUIRE(req.tasks.size() < kMaxTasks, Code::kInvalidArgument, "a group holds at most ",
             kMaxTasks - 1, " tasks, got ", req.tasks.size());
  JR_ASSIGN_OR_RETURN(CostModel model, BuildCostModel(req.topo));
  const TopologyView& topo = req.topo;
  const PlanContext ctx{topo, model, req.tuning, req.params, req.rank, req.opCount};

  Plan plan;
  plan.rank = req.rank;
  plan.nRanks = topo.nRanks;
  plan.tasks.resize(req.tasks.size());

  GroupState g;
  g.colls.reserve(req.tasks.size());

  // Intake (taskAppend).
  for (size_t i = 0; i < req.tasks.size(); ++i) {
    const TaskDesc& t = req.tasks[i];
    JR_CHECK(ArgsCheck(req, int(i), t));
    TaskPlan& tp = plan.tasks[i];
    tp.index = int(i);
    tp.coll = t.coll;
    tp.dtype = t.dtype;
    tp.count = t.count;
    tp.op = t.op;
    tp.root = t.root;
    tp.peer = t.peer;
    if (t.coll == Coll::kSend || t.coll == Coll::kRecv) {
      P2pInfo p;
      p.index = int(i);
      p.peer = t.peer;
      p.isSend = t.coll == Coll::kSend;
      p.dtype = t.dtype;
      p.count = t.count;
      p.bytes = int64_t(t.count * DataTypeSize(t.dtype));
      tp.nBytes = p.bytes;
      tp.pattern = Pattern::kP2p;
      if (g.sendQueue.empty()) {  // per-peer queues only for groups with p2p
        g.sendQueue.resize(topo.nRanks);
        g.recvQueue.resize(topo.nRanks);
      }
      g.p2ps.push_back(p);
      (p.isSend ? g.sendQueue : g.recvQueue)[t.peer].push_back(int(g.p2ps.size()) - 1);
      g.nTasksP2p += 1;
      continue;
    }
    CollInfo info;
    info.index = int(i);
    info.coll = t.coll;
    info.dtype = t.dtype;
    // Data movement reduces nothing: RCCL's all_gather and broadcast always carry sum.
    const bool moves = t.coll == Coll::kAllGather || t.coll == Coll::kBroadcast;
    info.op = moves ? int32_t(kSum) : t.op;
    tp.op = info.op;
    info.count = t.count;
    info.root = (t.coll == Coll::kBroadcast || t.coll == Coll::kReduce) ? t.root : 0;
    SetDerived(&info, topo.nRanks);  // all_gather/broadcast become bytes of int8
    tp.nBytes = info.nBytes;
    if (t.count == 0) continue;  // nothing to run (taskAppend drops it before the op)
    JR_ASSIGN_OR_RETURN(info.opFull, HostToDevRedOp(info.op, info.dtype, topo.nRanks, req.userOps));
    tp.opFull = info.opFull;
    if (topo.nRanks == 1) {
      // ncclLaunchOneRank: a copy (a PreMulSum scaling for avg on floats and user ops).
      plan.oneRank = true;
      tp.algo = Algo::kRing;
      tp.proto = Proto::kSimple;
      continue;
    }
    g.colls.push_back(info);
    g.workBytesTotal += info.workBytes;
    g.nTasksColl += 1;
  }

  SortCollQueue(&g);
  if (g.nTasksP2p != 0) ComputeP2pSchedule(topo, req.rank, &g.p2pSendOrder, &g.p2pRecvOrder);

  // The planning loop: one kernel plan per pass until every task is placed.
  while (g.nTasksColl + g.nTasksP2p != 0) {
    const int kernelIndex = int(plan.kernels.size());
    plan.kernels.emplace_back(plan.arena.get());
    KernelPlan& kp = plan.kernels.back();
    int nWorkBudget = req.persistent ? INT_MAX : topo.workFifoDepth / 2;
    const int nWorkBudgetOld = nWorkBudget;
    // Collectives first: every rank cuts kernels at the same places only if collectives, which
    // all ranks share, are drained before the rank-specific p2p work.
    if (g.nTasksColl != 0) JR_CHECK(ScheduleCollTasks(ctx, &g, &kp, kernelIndex, &nWorkBudget));
    if (g.nTasksColl == 0 && g.nTasksP2p != 0) {
      JR_CHECK(ScheduleP2pTasks(ctx, &g, &kp, kernelIndex, &nWorkBudget));
    }
    JR_REQUIRE(nWorkBudget != nWorkBudgetOld, Code::kInvalidArgument,
               "topology.work_fifo_depth=", topo.workFifoDepth,
               " is too small to hold one launch; the minimum is ", 2 * kMaxChannels);
    FinishKernelPlan(ctx, &kp);
  }

  // Report what was decided, per task in the order given.
  for (const CollInfo& c : g.colls) {
    TaskPlan& tp = plan.tasks[c.index];
    tp.algo = c.algo;
    tp.proto = c.proto;
    tp.pattern = c.pattern;
    tp.nChannels = c.channelsUsed;
    tp.nThreads = c.nThreads;
    tp.chunkSize = c.chunkSize;
    tp.chunkCount = c.chunkCount;
    tp.chunkSteps = c.chunkSteps;
    tp.sliceSteps = c.sliceSteps;
    tp.stepSize = c.stepSize;
    tp.funcIndex = c.funcIndex;
    tp.userTuned = c.userTuned;
    tp.aggBytes = c.aggnBytes;
    tp.predictedUs = c.predictedUs;
    tp.choiceNote = c.choiceNote;
    tp.kernel = c.kernel;
  }
  for (const P2pInfo& p : g.p2ps) {
    TaskPlan& tp = plan.tasks[p.index];
    tp.proto = p.firstProto;
    tp.nChannels = p.channelsUsed;
    tp.nThreads = kMaxNThreads;
    tp.chunkSize = 0;
    tp.kernel = p.kernel;
    tp.funcIndex = DevFuncIdP2p();
  }
  return plan;
}

}  // namespace jax_rccl
