// Point-to-point scheduling: the per-step peer order, the channel of each chunk, chunking across
// channels, and placing send/recv elements into works.
//
// After RCCL rocm-6.2.0: the peer order of src/init.cc (the "p2p structures" setup in
// initTransportsRank), the channel mapping of src/include/channel.h (ncclChannelCompute), the
// element chunk size of src/proxy.cc (ncclProxyComputeP2p), and finishWorkP2p,
// appendWorkElemP2p, addP2pToPlan, calcP2pChunkSize and scheduleP2pTasksToPlan of
// src/enqueue.cc.
//
// Ranks are laid out node-major: rank r lives on node r / localRanks as local rank
// r % localRanks, and every node holds the same number of ranks (ValidateTopology).
//
// Differences from RCCL, on purpose:
//  - Elements name their buffer by slot (the task's index) and a byte offset into it.
//  - The element chunk size is the one RCCL computes for a peer reached without a network
//    transport: buffSizes[LL]/kSteps for LL, p2pChunkSize for Simple. RCCL shrinks it for a peer
//    behind the network (1/4 for Simple chunks under one step, else 1/2 under eight steps);
//    that tuning is left out, so a plan's elements do not depend on which peers are remote (the
//    proxy op of such a peer carries the same chunk size as its element). NCCL_CHUNK_SIZE (an
//    env override, default 0) is not read.
//  - No buffer registration (reg = 0). Each piece gets a proxy op when its peer is on another
//    node (proxy.cc), with the element's chunk size (the network tuning above left out).
//  - A pass over the schedule that places nothing while tasks remain is an internal error
//    instead of a spin (it cannot happen with a schedule that covers every rank).
#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "ffi/planner/internal.h"

namespace jax_rccl {
namespace {

// Reverses the low log2(pow2) bits of val: the p2p channel table entry of val (after RCCL
// src/graph/topo.h mirrorBits, used for comm->p2pChannels in src/graph/paths.cc).
int MirrorBits(int val, int pow2) {
  int mirror = 0;
  for (int b = 1, mb = pow2 >> 1; b < pow2; b <<= 1, mb >>= 1) {
    if (val & b) mirror |= mb;
  }
  return mirror;
}

// ncclChannelComputeBase: the schedule step (plus the node distance on several nodes) between
// `rank` and `peer`, seen from the side that sends (isSend) or receives.
int P2pChannelBase(const TopologyView& topo, int rank, int peer, bool isSend) {
  // NCCL_MAX_WORK_ELEMENTS_P2P/2 elements of one type fit a work: the group of steps that fuse.
  constexpr int kP2pGroupSize = kMaxWorkElementsP2p / 2;
  const int local = topo.localRanks();
  const int nNodes = topo.nNodes;
  const int node = rank / local, rankIndex = rank % local;
  const int peerNode = peer / local, peerIndex = peer % local;
  const int nSteps = local;  // maxLocalRanks
  int step, delta;
  if (isSend) {
    step = (nSteps + peerIndex - rankIndex) % nSteps;
    delta = (nNodes + peerNode - node) % nNodes;
  } else {
    step = (nSteps + rankIndex - peerIndex) % nSteps;
    delta = (nNodes + node - peerNode) % nNodes;
  }
  return nNodes > 1 ? delta + step / kP2pGroupSize : step;
}

// Whether a p2p element may run LL: the connection has an LL buffer and the piece is small.
// (RCCL also refuses LL on gfx12, an architecture this project does not have.)
Proto P2pProto(const PlanContext& ctx, int64_t bytes) {
  const bool hasLL = ctx.topo.buffSizes[int(Proto::kLL)] > 0;
  return hasLL && bytes <= ctx.params.p2pLLThreshold ? Proto::kLL : Proto::kSimple;
}

// The element's chunk size (ncclProxyComputeP2p, for a peer reached without a network).
int64_t P2pElemChunkSize(const TopologyView& topo, Proto proto) {
  if (proto == Proto::kSimple) return topo.p2pChunkSize;
  return topo.buffSizes[int(proto)] / kSteps;
}

// appendWorkElemP2p: receives take the even slots of a work and sends the odd ones; an element
// joins the channel's tail work when the caller allows fusing, a slot of its type is free, and
// no element of its type in that work talks to the same peer (they would share a connection).
Status AppendWorkElemP2p(const TopologyView& topo, KernelPlan* kp, int c, const WorkElemP2p& elem,
                         bool fuseOk) {
  const int funcIndex = DevFuncIdP2p();
  JR_REQUIRE(funcIndex >= 0 && funcIndex <= 0xffff, Code::kUnsupported,
             "send/recv has no device function in this build (function index ", funcIndex, ")");
  ChannelPlan& ch = kp->channels[c];
  const int t = int(elem.p2pType) - 1;  // p2pTailElem is indexed by type - 1: send 0, recv 1
  if (!ch.works.empty() && ch.works.back().header.type == kWorkTypeP2p &&
      ch.works.back().header.funcIndex == funcIndex) {
    Work& tail = ch.works.back();
    if (fuseOk && ch.p2pTailElem[t] < kMaxWorkElementsP2p) {
      bool samePeer = false;
      for (int e = ch.p2pTailElem[t] - 2; e >= 0; e -= 2) {
        if (tail.p2pElems[e].peer == elem.peer) samePeer = true;
      }
      if (!samePeer) {
        tail.p2pElems[ch.p2pTailElem[t]] = elem;
        ch.p2pTailElem[t] += 2;
        return Status::Ok();
      }
    }
    FinishWorkP2p(&tail, topo.warpSize());
  }
  Work work;
  std::memset(&work, 0, sizeof(work));
  work.header.type = kWorkTypeP2p;
  work.header.funcIndex = uint16_t(funcIndex);
  ch.p2pTailElem[kWorkP2pTypeRecv - 1] = 0;
  ch.p2pTailElem[kWorkP2pTypeSend - 1] = 1;
  work.p2pElems[ch.p2pTailElem[t]] = elem;
  ch.p2pTailElem[t] += 2;
  ch.works.push_back(work);
  return Status::Ok();
}

// addP2pToPlan: one piece of `task` (`bytes` at byte `offset`) as an element on the channel of
// the task's current chunk. The caller made sure *nWorkBudget >= 1.
Status AddP2pToPlan(const PlanContext& ctx, KernelPlan* kp, int kernelIndex, int* nWorkBudget,
                    P2pInfo* task, int64_t offset, int64_t bytes, int connIndex, bool fuseOk) {
  const TopologyView& topo = ctx.topo;
  const int c =
      P2pChannel(topo, ctx.rank, task->peer, task->chunk % topo.p2pnChannelsPerPeer, task->isSend);
  const Proto proto = P2pProto(ctx, bytes);

  WorkElemP2p elem;
  std::memset(&elem, 0, sizeof(elem));
  elem.peer = task->peer;  // every task names a buffer (slot), so never -1
  elem.connIndex = uint32_t(connIndex);
  elem.proto = int32_t(proto);
  elem.p2pType = task->isSend ? kWorkP2pTypeSend : kWorkP2pTypeRecv;
  elem.nWarps = uint16_t(kMaxNThreads / topo.warpSize());
  elem.reg = 0;
  elem.opCount = uint16_t(ctx.opCount) & 0xfff;
  elem.offsetLo = uint32_t(uint64_t(offset));
  elem.offsetHi = uint32_t(uint64_t(offset) >> 32) & 0xffff;
  elem.slot = uint32_t(task->index) & 0xffff;
  elem.countLo = uint32_t(uint64_t(bytes));
  elem.countHi = uint32_t(uint64_t(bytes) >> 32);
  elem.chunkSize = int32_t(P2pElemChunkSize(topo, proto));

  const int nWorkBefore = kp->channels[c].nWork();
  JR_CHECK(AppendWorkElemP2p(topo, kp, c, elem, fuseOk));
  *nWorkBudget -= kp->channels[c].nWork() - nWorkBefore;

  // The proxy op (ncclProxyComputeP2p): numbered by the work the element settled in, which is
  // always the channel's last.
  ProxyOp op = InitP2pProxyOp(*task, c, proto, bytes, elem.chunkSize, connIndex);
  op.opCount = uint64_t(kp->channels[c].nWork()) << 1 | 1;
  AddProxyOpIfNeeded(ctx, kp, op);

  if (task->kernel < 0) task->kernel = kernelIndex;
  if (task->firstProto == Proto::kUndef) task->firstProto = proto;
  return Status::Ok();
}

}  // namespace

void ComputeP2pSchedule(const TopologyView& topo, int rank, std::vector<int>* sendOrder,
                        std::vector<int>* recvOrder) {
  const int nNodes = std::max(1, topo.nNodes);
  const int local = topo.localRanks();
  const int node = rank / local;
  const int localRank = rank % local;
  // Steps per node block: maxLocalRanks rounded to the fusing group of
  // kMaxWorkElementsP2p/2 = 1 (ALIGN_POWER), i.e. localRanks.
  constexpr int kGroup = kMaxWorkElementsP2p / 2;
  const int steps = local > kGroup ? int(AlignUp(local, kGroup)) : kGroup / (kGroup / local);
  sendOrder->clear();
  recvOrder->clear();
  sendOrder->reserve(size_t(nNodes) * steps);
  recvOrder->reserve(size_t(nNodes) * steps);
  // The node distances in the order 0, +n/2, +1, -1, +n/2-1, -(n/2-1), ... (four per round d,
  // skipping repeats); within a distance, step s sends to local rank +s of the node ahead and
  // receives from local rank -s of the node behind.
  for (int d = 0; d <= nNodes / 4; ++d) {
    const int deltas[4] = {d, (nNodes - d) % nNodes, nNodes / 2 - d,
                           (nNodes - (nNodes / 2 - d)) % nNodes};
    for (int index = 0; index < 4;) {
      const int delta = deltas[index];
      const int recvNode = (node + nNodes - delta) % nNodes;
      const int sendNode = (node + delta) % nNodes;
      for (int step = 0; step < steps; ++step) {
        const int recvIndex = (localRank - step + steps) % steps;
        recvOrder->push_back(recvIndex < local ? recvNode * local + recvIndex : -1);
        const int sendIndex = (localRank + step) % steps;
        sendOrder->push_back(sendIndex < local ? sendNode * local + sendIndex : -1);
      }
      ++index;
      if (index == 1 && deltas[1] == deltas[0]) ++index;
      if (index == 2 && deltas[2] == deltas[0]) ++index;
      if (index == 3 && deltas[3] == deltas[2]) ++index;
      if (index == 3 && deltas[3] == deltas[1]) ++index;
    }
  }
}

int P2pChannel(const TopologyView& topo, int rank, int peer, int chunk, bool isSend) {
  // ncclChannelComputeFromBase: the mirrored table entry of the base, shifted by the chunk.
  const int n = topo.p2pnChannels;
  const int base = P2pChannelBase(topo, rank, peer, isSend);
  return (MirrorBits(base % n, n) + chunk) % n;
}

int64_t CalcP2pChunkSize(int64_t totalSize, int minChannels, int maxChannels, int64_t minSize,
                         int64_t maxSize) {
  int64_t size = std::max(minSize, DivUp(totalSize, minChannels));
  int nChannels = minChannels;
  while (size > maxSize && nChannels <= maxChannels / 2) {
    nChannels *= 2;
    size = DivUp(totalSize, nChannels);
  }
  return AlignUp(size, minSize);
}

void FinishWorkP2p(Work* work, int warpSize) {
  int nElem = 0;
  for (int e = 0; e < kMaxWorkElementsP2p; ++e) {
    if (work->p2pElems[e].p2pType != kWorkP2pTypeUnused) nElem = e + 1;
  }
  const int warps = kMaxNThreads / warpSize;
  int nGroup = 1;
  while (nGroup < nElem) nGroup *= 2;
  int nWarp = 1;
  while (nWarp * nGroup <= warps / 2) nWarp *= 2;
  for (int i = 0; i < nGroup; ++i) {
    work->p2pElems[i].ngroups = uint16_t(nGroup);
    work->p2pElems[i].warpStart = uint16_t(i * warps / nGroup);
    work->p2pElems[i].nWarps = uint16_t(nWarp);
  }
}

Status ScheduleP2pTasks(const PlanContext& ctx, GroupState* g, KernelPlan* kp, int kernelIndex,
                        int* nWorkBudget) {
  const TopologyView& topo = ctx.topo;
  const int nRanks = topo.nRanks;
  const int rank = ctx.rank;
  JR_REQUIRE(int(g->sendQueue.size()) == nRanks && int(g->recvQueue.size()) == nRanks,
             Code::kInternal, "p2p queues must have one entry per rank (", nRanks, "), got ",
             g->sendQueue.size(), " send and ", g->recvQueue.size(), " recv queues");
  if (g->p2pSendOrder.empty()) {
    ComputeP2pSchedule(topo, rank, &g->p2pSendOrder, &g->p2pRecvOrder);
  }
  JR_REQUIRE(g->p2pSendOrder.size() == g->p2pRecvOrder.size(), Code::kInternal,
             "p2p send and recv orders differ in length");

  kp->threadPerBlock = std::max(kp->threadPerBlock, kMaxNThreads);

  // Split a task into pieces of about one step (p2pChunkSize), spread over the channels a peer
  // may use, but only one channel per peer once all peers together would exceed p2pnChannels.
  const int64_t stepSize = topo.p2pChunkSize;
  const int nChannelsMax = topo.p2pnChannelsPerPeer;
  int nChannelsMin = nChannelsMax;
  while (nChannelsMin * nRanks > topo.p2pnChannels && nChannelsMin > 1) nChannelsMin /= 2;
  const int64_t minSize = topo.nNodes > 1 ? stepSize / 2 : stepSize / 8;
  const int64_t maxSize = topo.nNodes > 1 ? stepSize : stepSize * 32;
  JR_REQUIRE(minSize > 0, Code::kInvalidArgument, "topology.p2p_chunk_size (", stepSize,
             ") is too small to split send/recv");
  auto chunksUsed = [&](const P2pInfo& t) {
    return std::min(t.chunk, std::min(topo.p2pnChannelsPerPeer, topo.p2pnChannels));
  };

  const int nSteps = int(g->p2pSendOrder.size());
  while (g->nTasksP2p != 0) {
    bool placed = false;
    for (int i = 0; i < nSteps; ++i) {
      const int sendPeer = g->p2pSendOrder[i];
      const int recvPeer = g->p2pRecvOrder[i];
      P2pInfo* send = sendPeer != -1 && !g->sendQueue[sendPeer].empty()
                          ? &g->p2ps[g->sendQueue[sendPeer].front()]
                          : nullptr;
      P2pInfo* recv = recvPeer != -1 && !g->recvQueue[recvPeer].empty()
                          ? &g->p2ps[g->recvQueue[recvPeer].front()]
                          : nullptr;
      if (sendPeer == rank) {
        JR_REQUIRE(recvPeer == rank, Code::kInternal, "p2p schedule of rank ", rank,
                   " pairs a send to self with a recv from rank ", recvPeer);
        JR_REQUIRE(!(send && !recv), Code::kInvalidUsage, "rank ", rank, ": send to self (task ",
                   send ? send->index : -1, ", peer ", rank, ") without a matching recv from self");
        JR_REQUIRE(!(recv && !send), Code::kInvalidUsage, "rank ", rank, ": recv from self (task ",
                   recv ? recv->index : -1, ", peer ", rank, ") without a matching send to self");
      }
      if (send == nullptr && recv == nullptr) continue;

      int64_t recvBytes = recv ? recv->bytes : 0;
      int64_t sendBytes = send ? send->bytes : 0;
      const int64_t recvChunkBytesMax =
          CalcP2pChunkSize(recvBytes, nChannelsMin, nChannelsMax, minSize, maxSize);
      const int64_t sendChunkBytesMax =
          CalcP2pChunkSize(sendBytes, nChannelsMin, nChannelsMax, minSize, maxSize);
      // A zero-byte send/recv is a sync: one empty element, carried as -1 bytes here.
      if (recv && recvBytes == 0) recvBytes = -1;
      if (send && sendBytes == 0) sendBytes = -1;
      // Resume at the task's current chunk (a sync is always at chunk 0).
      int64_t recvOffset = 0, sendOffset = 0;
      if (recv) {
        recvOffset = recv->chunk * recvChunkBytesMax;
        recvBytes -= recvOffset;
      }
      if (send) {
        sendOffset = send->chunk * sendChunkBytesMax;
        sendBytes -= sendOffset;
      }
      // Large pieces go through the network connection when p2pNet is on.
      const int sendIdx =
          ctx.params.p2pNet && sendBytes > ctx.params.p2pNetThreshold ? kConnIdxP2pNet : 1;
      const int recvIdx =
          ctx.params.p2pNet && recvBytes > ctx.params.p2pNetThreshold ? kConnIdxP2pNet : 1;

      // Places the next piece of one side (its task `t`, first in queues[peer]) unless the side
      // is done; *full when the kernel has no work element left for it.
      auto placePiece = [&](P2pInfo* t, std::vector<std::deque<int>>& queues, int peer,
                            int64_t* bytes, int64_t* offset, int64_t chunkBytesMax, int connIdx,
                            bool* fuseOk, bool* full) -> Status {
        int64_t chunkBytes = std::min(*bytes, chunkBytesMax);  // keeps -1
        if (chunkBytes == 0) return Status::Ok();
        if (chunkBytes == -1) chunkBytes = 0;
        if (*nWorkBudget < 1) {
          *full = true;
          return Status::Ok();
        }
        JR_CHECK(AddP2pToPlan(ctx, kp, kernelIndex, nWorkBudget, t, *offset, chunkBytes, connIdx,
                              *fuseOk));
        placed = true;
        *fuseOk = true;
        *offset += chunkBytes;
        *bytes -= chunkBytes;
        t->chunk += 1;
        t->offset = *offset;
        t->channelsUsed = chunksUsed(*t);
        if (*bytes <= 0) {
          *bytes = 0;
          queues[peer].pop_front();
          g->nTasksP2p -= 1;
        }
        return Status::Ok();
      };

      do {
        // Only the recv and the send of one round may share a fresh work (RCCL: the round
        // index modulo kMaxWorkElementsP2p/2 = 1 is always 0).
        bool fuseOk = false;
        bool full = false;
        JR_CHECK(placePiece(recv, g->recvQueue, recvPeer, &recvBytes, &recvOffset,
                            recvChunkBytesMax, recvIdx, &fuseOk, &full));
        if (full) return Status::Ok();  // the caller starts a new kernel
        JR_CHECK(placePiece(send, g->sendQueue, sendPeer, &sendBytes, &sendOffset,
                            sendChunkBytesMax, sendIdx, &fuseOk, &full));
        if (full) return Status::Ok();
      } while (sendBytes != 0 || recvBytes != 0);
    }
    JR_REQUIRE(placed || g->nTasksP2p == 0, Code::kInternal, g->nTasksP2p, " p2p tasks of rank ",
               rank, " are not reached by the p2p schedule");
  }
  return Status::Ok();
}

}  // namespace jax_rccl
