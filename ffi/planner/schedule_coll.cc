// Scheduling the group's collectives onto the channels of one kernel plan.
//
// After RCCL src/enqueue.cc (scheduleCollTasksToPlan, addCBDCollToPlan, addTunedCollToPlan,
// getCBDCollnChannel, appendWorkElemColl) without CollNet, NVLS and buffer registration; each
// part placed on a channel gets its proxy op where the channel crosses nodes (proxy.cc).
// Consecutive queued tasks of one (collective, device op, datatype) are costed together;
// "CBD" (channel-by-data) tasks are then cut into equal byte shares over the usable channels,
// and tasks whose channel count a tuner fixed go to the least loaded channels.
#include <algorithm>
#include <cstdint>

#include "ffi/planner/internal.h"

namespace jax_rccl {

namespace {

constexpr int kWorkCountBits = 39;
constexpr int kLastChunkCountBits = 25;
constexpr uint64_t FieldMax(int bits) {
  return (uint64_t(1) << bits) - 1;
}

// setCollWorkElem, with the bit-field limits checked.
Status SetCollWorkElem(const CollInfo& info, uint64_t workCount, uint64_t workOffset,
                       int64_t lastChunkCount, WorkElemColl* e) {
  JR_REQUIRE(workCount <= FieldMax(kWorkCountBits) && workOffset <= FieldMax(kWorkCountBits),
             Code::kInvalidArgument, "task ", info.index, ": part of ", workCount,
             " elements at offset ", workOffset,
             " does not fit the work element's workCount/workOffset fields (at most 2^",
             kWorkCountBits, " - 1)");
  JR_REQUIRE(lastChunkCount >= 0 && uint64_t(lastChunkCount) <= FieldMax(kLastChunkCountBits),
             Code::kInvalidArgument, "task ", info.index, ": last chunk of ", lastChunkCount,
             " elements does not fit the work element's lastChunkCount field (at most 2^",
             kLastChunkCountBits, " - 1)");
  e->workCount = workCount;
  e->workOffset = workOffset;
  e->lastChunkCount = static_cast<uint64_t>(lastChunkCount);
  // Direct: one chunk is the element, up to the task's cap (chunk.cc).
  if (info.algo == Algo::kDirect) {
    e->chunkCount = std::min<uint64_t>(workCount, static_cast<uint64_t>(info.chunkCount));
  }
  return Status::Ok();
}

// The proxy op of one part (addProxyOpIfNeeded after initCollProxyOp). RCCL skips empty
// collectives, which never reach here (zero counts are dropped at intake).
void AddCollProxyOp(const PlanContext& ctx, KernelPlan* kp, const CollInfo& info, int c,
                    uint64_t opCount, uint64_t workCount) {
  if (info.nBytes == 0) return;
  const uint32_t nsteps = ComputeSteps(ctx, info, workCount);
  AddProxyOpIfNeeded(ctx, kp, InitCollProxyOp(ctx, info, c, opCount, nsteps));
}

bool SameAggregate(const CollInfo& a, const CollInfo& b) {
  // RCCL compares the device op only (not its scalar): tasks differing only in a PreMulSum
  // scalar are costed together; each element still carries its own scalar.
  return a.coll == b.coll && a.opFull.op == b.opFull.op && a.dtype == b.dtype;
}

// Channel c's share of a task (`workCount` elements from `workOffset`): its work element appended
// (the budget charged with the works the append adds: 0 when fused into the tail) and its proxy op.
Status AppendCollShare(const PlanContext& ctx, KernelPlan* kp, const CollInfo& info, int c,
                       int64_t workCount, int64_t workOffset, int64_t alignCount, uint64_t opCount,
                       WorkElemColl* elem, int* nWorkBudget) {
  const int64_t lastChunkCount = ComputeLastChunkCount(ctx, info, uint64_t(workCount), alignCount);
  JR_CHECK(SetCollWorkElem(info, uint64_t(workCount), uint64_t(workOffset), lastChunkCount, elem));
  ChannelPlan& ch = kp->channels[c];
  *nWorkBudget += ch.nWork();
  AppendWorkElemColl(kp, c, info.funcIndex, *elem);
  *nWorkBudget -= ch.nWork();
  AddCollProxyOp(ctx, kp, info, c, opCount, uint64_t(workCount));
  return Status::Ok();
}

// getCBDCollnChannel. RCCL defines it but never calls it (the CBD budget check uses the
// aggregate's share instead); kept for reference and for explain-style diagnostics.
[[maybe_unused]] int CbdCollnChannel(const KernelPlan& kp, const CollInfo& info,
                                     int usableChannels) {
  const int64_t workBytesTotal = info.workBytes;
  if (workBytesTotal == 0) return 1;
  const int64_t typeSize = static_cast<int64_t>(DataTypeSize(info.dtype));
  const int64_t maxCount = DivUp(kp.maxBytesPerChannel, typeSize);
  for (int c = 0; c < usableChannels; ++c) {
    const int64_t collBytes = kp.channels[c].collBytes;
    if (kp.maxBytesPerChannel <= collBytes) continue;
    int64_t firstEnqBytes = std::min(kp.maxBytesPerChannel - collBytes, workBytesTotal);
    firstEnqBytes = DivUp(firstEnqBytes, typeSize) * typeSize;
    return 1 + static_cast<int>(DivUp((workBytesTotal - firstEnqBytes) / typeSize, maxCount));
  }
  return info.nChannels;
}

// addCBDCollToPlan: the task takes what is left of each channel's byte share, channel by
// channel from 0, in aligned parts.
Status AddCbdColl(const PlanContext& ctx, KernelPlan* kp, int usableChannels, int kernelIndex,
                  CollInfo* info, int* nWorkBudget) {
  const uint64_t opCount = uint64_t(kp->collOpCount++) << 1;  // a collective's proxy opCount
  const int64_t typeSize = static_cast<int64_t>(DataTypeSize(info->dtype));
  int64_t workBytesTotal = static_cast<int64_t>(info->count) * typeSize;
  int64_t workCountTotal = static_cast<int64_t>(info->count);
  int64_t workOffset = 0;
  int used = 0;

  JR_CHECK(ComputeChunkInfo(ctx, info, info->aggnBytes, info->nChannels));
  const int64_t alignCount = ComputeAlignCount(ctx, *info);
  WorkElemColl elem = InitCollWorkElem(ctx, *info);
  for (int c = 0; c < usableChannels; ++c) {
    ChannelPlan& ch = kp->channels[c];
    if (kp->maxBytesPerChannel <= ch.collBytes) continue;  // this channel's share is used up
    if (workBytesTotal == 0) break;
    int64_t enqBytes = std::min(kp->maxBytesPerChannel - ch.collBytes, workBytesTotal);
    const int64_t workCount =
        std::min(DivUp(DivUp(enqBytes, typeSize), alignCount) * alignCount, workCountTotal);
    enqBytes = workCount * typeSize;

    JR_CHECK(AppendCollShare(ctx, kp, *info, c, workCount, workOffset, alignCount, opCount, &elem,
                             nWorkBudget));

    workBytesTotal -= enqBytes;
    workCountTotal -= workCount;
    ch.collBytes += enqBytes;
    workOffset += workCount;
    ++used;
  }
  JR_REQUIRE(workCountTotal == 0, Code::kInternal, "task ", info->index, ": ", workCountTotal,
             " of ", info->count, " elements found no channel share (", usableChannels,
             " channels of ", kp->maxBytesPerChannel, " bytes)");

  kp->threadPerBlock = std::max(kp->threadPerBlock, info->nThreads);
  info->kernel = kernelIndex;
  info->channelsUsed = used;
  return Status::Ok();
}

// addTunedCollToPlan: the task is split evenly over its tuned channel count, placed on the
// least loaded channels (all distinct).
Status AddTunedColl(const PlanContext& ctx, KernelPlan* kp, int usableChannels, int kernelIndex,
                    CollInfo* info, int* nWorkBudget) {
  const uint64_t opCount = uint64_t(kp->collOpCount++) << 1;
  const int64_t typeSize = static_cast<int64_t>(DataTypeSize(info->dtype));
  const int64_t count = static_cast<int64_t>(info->count);
  int nChannels = std::min(info->nChannels, usableChannels);
  JR_REQUIRE(nChannels >= 1, Code::kInternal, "task ", info->index,
             ": tuned channel count must be >= 1, got ", info->nChannels);

  const int64_t alignCount = ComputeAlignCount(ctx, *info);
  const int64_t countPerChannel = DivUp(DivUp(count, nChannels), alignCount) * alignCount;
  nChannels = static_cast<int>(DivUp(count, countPerChannel));
  JR_CHECK(ComputeChunkInfo(ctx, info, info->nBytes, nChannels));
  WorkElemColl elem = InitCollWorkElem(ctx, *info);

  // Pick the nChannels least loaded of the usable channels: start from the first nChannels,
  // then let each later channel replace the current most loaded pick when it has fewer bytes.
  int least[kMaxChannels];
  const auto& chans = kp->channels;
  int maxIndexInLeast = 0;
  int64_t maxBytesInLeast = chans[0].collBytes;
  least[0] = 0;
  for (int b = 1; b < nChannels; ++b) {
    least[b] = b;
    if (maxBytesInLeast < chans[b].collBytes) {
      maxIndexInLeast = b;
      maxBytesInLeast = chans[b].collBytes;
    }
  }
  for (int c = nChannels; c < usableChannels; ++c) {
    if (chans[c].collBytes < maxBytesInLeast) {
      least[maxIndexInLeast] = c;
      maxIndexInLeast = 0;
      maxBytesInLeast = chans[least[0]].collBytes;
      for (int b = 1; b < nChannels; ++b) {
        if (maxBytesInLeast < chans[least[b]].collBytes) {
          maxIndexInLeast = b;
          maxBytesInLeast = chans[least[b]].collBytes;
        }
      }
    }
  }

  int64_t remCount = count;
  int64_t workOffset = 0;
  int used = 0;
  for (int bid = 0; bid < nChannels && remCount > 0; ++bid) {
    const int c = least[bid];
    ChannelPlan& ch = kp->channels[c];
    const int64_t workCount = std::min(countPerChannel, remCount);
    JR_CHECK(AppendCollShare(ctx, kp, *info, c, workCount, workOffset, alignCount, opCount, &elem,
                             nWorkBudget));

    remCount -= workCount;
    ch.collBytes += workCount * typeSize;
    workOffset += workCount;
    ++used;
  }

  kp->threadPerBlock = std::max(kp->threadPerBlock, info->nThreads);
  info->kernel = kernelIndex;
  info->channelsUsed = used;
  return Status::Ok();
}

// The aggregation pass over the head of the queue: costs the run of tasks that share
// (collective, device op, datatype) as one, then gives each the aggregate's choice.
Status ChooseForAggregate(const PlanContext& ctx, GroupState* g, int head, int* accChannels) {
  const int nRanks = ctx.topo.nRanks;
  std::vector<int> run{head};
  for (int ix : g->collQueue) {  // the tasks queued after `head`
    if (!SameAggregate(g->colls[ix], g->colls[head])) break;
    run.push_back(ix);
  }

  CollInfo agg = g->colls[head];
  for (size_t i = 1; i < run.size(); ++i) agg.count += g->colls[run[i]].count;
  SetDerived(&agg, nRanks);
  JR_CHECK(GetTunerInfo(ctx, &agg, /*numPipeOps=*/1));
  JR_CHECK(GetAlgoInfo(ctx, &agg, /*numPipeOps=*/1));
  JR_CHECK(GetChannelThreadInfo(ctx, &agg));
  JR_CHECK(ComputeWorkFunc(&agg));
  JR_CHECK(GetPatternInfo(&agg));

  for (int ix : run) {
    CollInfo* info = &g->colls[ix];
    SetDerived(info, nRanks);
    JR_CHECK(GetTunerInfo(ctx, info, /*numPipeOps=*/1));  // may fix this task's nChannels
    info->algo = agg.algo;
    info->proto = agg.proto;
    info->nThreads = agg.nThreads;
    info->pattern = agg.pattern;
    info->funcIndex = agg.funcIndex;
    info->aggnBytes = agg.nBytes;
    info->predictedUs = agg.predictedUs;
    info->choiceNote = agg.choiceNote;
    JR_CHECK(GetChannelThreadInfo(ctx, info));
    // getChannnelThreadInfo may re-pick the algorithm or protocol from this task's own size
    // (RCCL's MI250X pivot rule). RCCL then keeps the aggregate's function, which no longer
    // matches the chunking; we recompute the function and pattern instead.
    if (info->algo != agg.algo || info->proto != agg.proto) {
      JR_CHECK(ComputeWorkFunc(info));
      JR_CHECK(GetPatternInfo(info));
    }
    *accChannels += info->nChannels;
  }
  return Status::Ok();
}

}  // namespace

void AppendWorkElemColl(KernelPlan* kp, int c, int funcIndex, const WorkElemColl& elem) {
  ChannelPlan& ch = kp->channels[c];
  if (!ch.works.empty()) {
    Work& tail = ch.works.back();
    if (tail.header.type == kWorkTypeColl && tail.header.funcIndex == funcIndex &&
        tail.elems[0].nWarps == elem.nWarps && ch.nWorkElem < kMaxWorkElements) {
      tail.elems[ch.nWorkElem++] = elem;
      return;
    }
  }
  Work w{};
  w.header.type = kWorkTypeColl;
  w.header.funcIndex = static_cast<uint16_t>(funcIndex);
  w.elems[0] = elem;
  ch.nWorkElem = 1;
  ch.works.push_back(w);
}

Status ScheduleCollTasks(const PlanContext& ctx, GroupState* g, KernelPlan* kp, int kernelIndex,
                         int* nWorkBudget) {
  // Bytes the CBD tasks share out; fixed for this plan (tuned tasks are taken out below).
  int64_t totalCBDBytes = g->workBytesTotal;

  if (!g->collQueue.empty()) {
    int usableChannels = 0;
    int accChannels = 0;
    g->usableChannels = 1;
    while (!g->collQueue.empty()) {
      const int ix = g->collQueue.front();
      g->collQueue.pop_front();
      CollInfo* info = &g->colls[ix];
      if (info->count == 0) continue;  // RCCL never queues these (taskAppend drops them)
      if (info->algo == Algo::kUndef) JR_CHECK(ChooseForAggregate(ctx, g, ix, &accChannels));

      usableChannels = std::max(usableChannels, ctx.topo.nChannels);  // comm->collChannels
      if (info->userTuned) {
        // Scheduled on their own channel count after the CBD tasks.
        totalCBDBytes -= info->workBytes;
        g->workBytesTotal -= info->workBytes;
        g->collTunedQueue.push_back(ix);
      } else {
        g->collCBDQueue.push_back(ix);
      }
    }
    g->usableChannels = std::min(usableChannels, accChannels);
  }
  // Not reachable with tasks queued (each has nChannels >= 1); keeps the division defined.
  const int usable = std::max(1, std::min(g->usableChannels, kMaxChannels));

  // Each channel's share of the CBD bytes, 16-byte aligned (a soft bound: aligned parts may
  // overshoot it).
  kp->maxBytesPerChannel =
      AlignUp(DivUp(std::max<int64_t>(totalCBDBytes, 0), usable), kBytesAlignment);

  while (!g->collCBDQueue.empty()) {
    CollInfo* info = &g->colls[g->collCBDQueue.front()];
    JR_REQUIRE(totalCBDBytes > 0, Code::kInternal, "task ", info->index,
               " is queued for channel sharing but the group has no bytes left to share");
    // An estimate from the aggregate's share (RCCL relaxes the budget with it, since the
    // real count is known only once the parts are cut).
    info->nChannels = static_cast<int>(DivUp(info->aggnBytes * usable, totalCBDBytes));
    if (*nWorkBudget < info->nChannels) return Status::Ok();  // next kernel
    g->collCBDQueue.pop_front();
    JR_CHECK(AddCbdColl(ctx, kp, usable, kernelIndex, info, nWorkBudget));
    g->nTasksColl -= 1;
    g->workBytesTotal -= static_cast<int64_t>(info->count * DataTypeSize(info->dtype));
  }

  while (!g->collTunedQueue.empty()) {
    CollInfo* info = &g->colls[g->collTunedQueue.front()];
    if (*nWorkBudget < info->nChannels) return Status::Ok();
    g->collTunedQueue.pop_front();
    JR_CHECK(AddTunedColl(ctx, kp, usable, kernelIndex, info, nWorkBudget));
    g->nTasksColl -= 1;
  }
  return Status::Ok();
}

}  // namespace jax_rccl
