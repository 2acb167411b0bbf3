// Chunking of one collective and its work element: chunk size per algorithm and protocol,
// element alignment, the last chunk of a part, the step count, and the element fields.
// After RCCL src/enqueue.cc (computeCollChunkInfo, computeCollAlignCount,
// computeCollLastChunkInfo, computeCollSteps, initCollWorkElem, setCollWorkElem), with the
// CollNet and NVLS branches left out, and our Direct algorithm added.
//
// Direct has no FIFO to size chunks for: one chunk is the whole work element. The element's
// chunkCount is its workCount (schedule_coll.cc sets it per element), capped at the largest
// multiple of the alignment that fits the 25-bit chunkCount field; a larger element runs in
// several chunks of that size, the last one (lastChunkCount) holding the rest. Elements are
// aligned like Simple's (Direct runs Simple only), and one step moves one chunk.
#include <algorithm>
#include <cstdint>

#include "ffi/planner/internal.h"

namespace jax_rccl {

namespace {

// Widths of the WorkElemColl bit fields (work.h).
constexpr int kCountBits = 39;
constexpr int kChunkCountBits = 25;
constexpr int kOpCountBits = 25;

constexpr uint64_t FieldMax(int bits) {
  return (uint64_t(1) << bits) - 1;
}

// floor(log2(n)) for n >= 1, 0 for n <= 1 (RCCL's log2i in src/include/utils.h).
int FloorLog2(int64_t n) {
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}

// Shared by the checks of both chunkings.
Status CheckCountFields(const CollInfo& info) {
  JR_REQUIRE(info.count <= FieldMax(kCountBits), Code::kInvalidArgument, "task ", info.index,
             ": count ", info.count, " does not fit the work element's count field (at most 2^",
             kCountBits, " - 1)");
  return Status::Ok();
}

// Direct: no FIFO, one chunk per element (see the top of the file). The task-level chunkCount
// is the cap an element's chunk may reach: the largest aligned count the field holds, or the
// task's count when smaller.
Status ComputeDirectChunkInfo(const PlanContext& ctx, CollInfo* info) {
  JR_REQUIRE(info->proto == Proto::kSimple, Code::kInternal, "task ", info->index,
             ": algorithm 'direct' runs protocol 'simple' only, got '", ProtoName(info->proto),
             "'");
  const int64_t typeSize = static_cast<int64_t>(DataTypeSize(info->dtype));
  const int64_t alignCount = ComputeAlignCount(ctx, *info);
  JR_REQUIRE(alignCount > 0 && static_cast<uint64_t>(alignCount) <= FieldMax(kChunkCountBits),
             Code::kInternal, "task ", info->index, ": alignment of ", alignCount,
             " elements out of range");
  const int64_t cap = static_cast<int64_t>(FieldMax(kChunkCountBits)) / alignCount * alignCount;
  const int64_t count = static_cast<int64_t>(std::max<uint64_t>(info->count, 1));
  info->chunkCount = std::min(cap, count);
  info->chunkSize = info->chunkCount * typeSize;
  info->chunkSteps = 1;
  info->sliceSteps = 1;
  info->stepSize = static_cast<int>(info->chunkSize);  // < 2^25 elements of <= 8 bytes
  return CheckCountFields(*info);
}

}  // namespace

Status ComputeChunkInfo(const PlanContext& ctx, CollInfo* info, int64_t nBytes, int nChannels) {
  JR_REQUIRE(info->proto != Proto::kUndef && info->algo != Algo::kUndef, Code::kInternal,
             "chunk info asked for task ", info->index, " before its algorithm and protocol");
  JR_REQUIRE(nChannels >= 1, Code::kInternal, "chunk info for task ", info->index,
             ": nChannels must be >= 1, got ", nChannels);
  if (info->algo == Algo::kDirect) return ComputeDirectChunkInfo(ctx, info);
  const int p = static_cast<int>(info->proto);
  const int64_t stepSize = ctx.topo.buffSizes[p] / kSteps;
  // Only Ring with Simple pipelines several steps per chunk; everything else moves one step.
  const bool ringSimple = info->algo == Algo::kRing && info->proto == Proto::kSimple;
  const int chunkSteps = ringSimple ? info->chunkSteps : 1;
  const int sliceSteps = ringSimple ? info->sliceSteps : 1;
  int64_t chunkSize = stepSize * chunkSteps;

  // LL carries 8 bytes of data per 16-byte line; LL128 7 data words per 8-word line.
  if (info->proto == Proto::kLL) chunkSize /= 2;
  if (info->proto == Proto::kLL128) chunkSize = (chunkSize / kLL128LineElems) * kLL128DataElems;

  // The loops below divide by nChannels * chunkSize; a zero chunk would never finish.
  JR_REQUIRE(chunkSize > 0, Code::kInvalidArgument, "topology.buff_sizes[", ProtoName(info->proto),
             "] = ", ctx.topo.buffSizes[p], " gives an empty chunk (", kSteps,
             " steps per buffer); raise it or exclude ", ProtoName(info->proto));

  if (info->algo == Algo::kTree && info->proto == Proto::kSimple) {
    if (info->pattern == Pattern::kTreeUpDown) {
      // Shrink the chunk until every rank of the tree has enough chunks in flight. RCCL uses the
      // task's own nBytes and nChannels here, not the arguments.
      JR_REQUIRE(info->nChannels >= 1, Code::kInternal, "chunk info for task ", info->index,
                 ": info.nChannels must be >= 1, got ", info->nChannels);
      const int64_t depth = ctx.model.treeDepth;
      auto perChunk = [&]() { return info->nBytes / (info->nChannels * chunkSize); };
      while (perChunk() < depth * 8 && chunkSize > 131072) chunkSize /= 2;
      while (perChunk() < depth * 4 && chunkSize > 65536) chunkSize /= 2;
      while (perChunk() < depth && chunkSize > 32768) chunkSize /= 2;
    }
  } else if (ringSimple) {
    if (info->pattern == Pattern::kPipelineFrom || info->pattern == Pattern::kPipelineTo) {
      JR_REQUIRE(info->nChannels >= 1, Code::kInternal, "chunk info for task ", info->index,
                 ": info.nChannels must be >= 1, got ", info->nChannels);
      auto perChunk = [&]() { return info->nBytes / (info->nChannels * chunkSize); };
      while (perChunk() < 64 && chunkSize > 262144) chunkSize /= 2;
      while (perChunk() < 32 && chunkSize > 131072) chunkSize /= 2;
      while (perChunk() < 16 && chunkSize > 65536) chunkSize /= 2;
      while (perChunk() < 8 && chunkSize > 32768) chunkSize /= 2;
    }
  } else if (info->algo == Algo::kTree && info->proto == Proto::kLL128) {
    // Steps an LL128 tree needs grow with the tree height (log2 of the nodes) and the ranks per
    // node; the thresholds are compared in float as RCCL does.
    const int nNodes = ctx.topo.nNodes;
    const float ppn = ctx.topo.nRanks / static_cast<float>(nNodes);
    const float nstepsLL128 = static_cast<float>(1 + FloorLog2(nNodes) + 0.1 * ppn);
    auto perChunk = [&]() {
      return static_cast<float>(static_cast<uint64_t>(nBytes) /
                                static_cast<uint64_t>(nChannels * chunkSize));
    };
    while (perChunk() < nstepsLL128 * 64 / ppn && chunkSize > 131072) chunkSize /= 2;
    while (perChunk() < nstepsLL128 * 16 / ppn && chunkSize > 32768) chunkSize /= 2;
  }

  const int64_t typeSize = static_cast<int64_t>(DataTypeSize(info->dtype));
  info->chunkSize = chunkSize;
  info->chunkCount = chunkSize / typeSize;
  info->chunkSteps = chunkSteps;
  info->sliceSteps = sliceSteps;
  info->stepSize = static_cast<int>(stepSize);

  // The element stores these in bit fields; refuse values that would be cut.
  JR_REQUIRE(info->chunkCount > 0, Code::kInvalidArgument, "task ", info->index, ": a ",
             ProtoName(info->proto), " chunk of ", chunkSize, " bytes holds no ",
             DataTypeName(info->dtype), " element; raise topology.buff_sizes[",
             ProtoName(info->proto), "]");
  JR_REQUIRE(static_cast<uint64_t>(info->chunkCount) <= FieldMax(kChunkCountBits),
             Code::kInvalidArgument, "task ", info->index, ": chunk of ", info->chunkCount,
             " elements does not fit the work element's chunkCount field (at most 2^",
             kChunkCountBits, " - 1); lower topology.buff_sizes[", ProtoName(info->proto), "]");
  return CheckCountFields(*info);
}

int64_t ComputeAlignCount(const PlanContext& ctx, const CollInfo& info) {
  const int64_t typeSize = static_cast<int64_t>(DataTypeSize(info.dtype));
  if (info.proto == Proto::kSimple) {
    // NCCL_SIMPLE_ALIGNMENT: 16 bytes per thread, 8 unrolled loads, one warp.
    const int64_t simpleAlignment = int64_t(ctx.topo.warpSize()) * 8 * 16;
    return simpleAlignment / typeSize;
  }
  // LL and LL128 (RCCL aligns LL128 like LL for now): 8 bytes per thread.
  return kLLAlignmentPerThread / typeSize * info.nThreads;
}

int64_t ComputeLastChunkCount(const PlanContext& ctx, const CollInfo& info, uint64_t workCount,
                              int64_t alignCount) {
  if (info.coll == Coll::kAllReduce && info.algo == Algo::kRing) {
    // A ring all-reduce moves nRanks chunks per loop; the last loop splits what is left evenly
    // over the ranks, rounded up to the alignment.
    const uint64_t nRanks = static_cast<uint64_t>(ctx.topo.nRanks);
    const uint64_t remCount = workCount % (nRanks * static_cast<uint64_t>(info.chunkCount));
    return DivUp(DivUp(static_cast<int64_t>(remCount), nRanks), alignCount) * alignCount;
  }
  if (info.algo == Algo::kDirect && workCount > 0) {
    // The element is one chunk, or chunks of the capped size: the last holds the rest.
    const uint64_t chunk = std::min<uint64_t>(workCount, static_cast<uint64_t>(info.chunkCount));
    return static_cast<int64_t>(workCount - (workCount - 1) / chunk * chunk);
  }
  return info.chunkCount;
}

uint32_t ComputeSteps(const PlanContext& ctx, const CollInfo& info, uint64_t workCount) {
  const uint64_t nRanks = static_cast<uint64_t>(ctx.topo.nRanks);
  const uint64_t chunkCount = static_cast<uint64_t>(info.chunkCount);
  const uint64_t chunkSteps = static_cast<uint64_t>(info.chunkSteps);
  auto divUp = [](uint64_t x, uint64_t y) { return (x + y - 1) / y; };
  uint64_t steps;
  if (info.algo == Algo::kRing && info.coll == Coll::kAllReduce) {
    // Reduce-scatter then all-gather around the ring: 2 * (nRanks - 1) steps per loop.
    steps = divUp(workCount, nRanks * chunkCount) * (nRanks - 1) * 2 * chunkSteps;
  } else if (info.algo == Algo::kRing &&
             (info.coll == Coll::kReduceScatter || info.coll == Coll::kAllGather)) {
    steps = divUp(workCount, chunkCount) * (nRanks - 1) * chunkSteps;
  } else {
    steps = divUp(workCount, chunkCount) * chunkSteps;
  }
  return static_cast<uint32_t>(steps);  // RCCL stores the proxy's step count in 32 bits
}

WorkElemColl InitCollWorkElem(const PlanContext& ctx, const CollInfo& info) {
  // Preconditions checked by ComputeChunkInfo: count and chunkCount fit their fields.
  WorkElemColl e{};
  e.isUsed = 1;
  e.redOpArgIsPtr = info.opFull.scalarArgIsPtr ? 1 : 0;
  e.regUsed = 0;
  e.oneNode = ctx.topo.nNodes == 1 ? 1 : 0;
  e.nWarps = static_cast<uint8_t>(info.nThreads / ctx.topo.warpSize());
  e.direct = 0;  // only CollNet Direct sets a direction
  e.root = static_cast<uint32_t>(info.root);
  e.connIndex = 0;
  // RCCL routes large Ring/Simple collectives over the network connection when intra-node
  // traffic through the NIC is enabled (RCCL_INTRANET_THRESHOLD).
  if (info.proto == Proto::kSimple && info.algo == Algo::kRing && ctx.params.useIntraNet &&
      info.nBytes > ctx.params.intraNetThreshold) {
    e.connIndex = kConnIdxP2pNet;
  }
  e.slot = static_cast<uint32_t>(info.index);
  e.count = info.count;
  // The op counter wraps in its 25 bits, as RCCL's bit field does.
  e.opCount = ctx.opCount & FieldMax(kOpCountBits);
  e.redOpArg = info.opFull.scalarArg;
  e.chunkCount = static_cast<uint64_t>(info.chunkCount);
  return e;
}

}  // namespace jax_rccl
