// Proxy ops: what a network proxy moves for each channel of a kernel launch.
//
// After RCCL rocm-6.2.0 src/enqueue.cc (initCollProxyOp, addProxyOpIfNeeded, the p2p proxy op of
// addP2pToPlan, uploadProxyOps) and src/proxy.cc (ncclProxyComputeP2p's step count,
// ncclProxySaveOp's inquiry and NeedProxy). NCCL asks each connection whether its transport has
// a proxy; here a connection has one exactly when it joins ranks of two nodes (a network
// connection: node-major ranks, NodeOf in types.h).
//
// The neighbours a channel's connections join are those the executors run
// (ffi/compute/coll_program.h), the same on every channel: the ring in rank order (next = rank +
// 1), which is RCCL's ring across nodes for node-major ranks in their order inside each node; the
// tree as one chain over all ranks in rank order (up = rank - 1, down = rank + 1). RCCL's tree
// is a chain inside each node with a double binary tree across the nodes' first ranks; a runtime
// that runs that tree changes TreeNeighbours below with it (docs/planner.md, "Proxy ops").
#include <algorithm>
#include <limits>

#include "ffi/planner/internal.h"

namespace jax_rccl {
namespace {

constexpr int64_t kLLLineBytes = 16;  // sizeof(union ncclLLFifoLine): 8 data and 8 flag bytes

bool OnOtherNode(const TopologyView& topo, int rank, int peer) {
  return peer >= 0 && peer != rank && NodeOf(topo, peer) != NodeOf(topo, rank);
}

// SaveProxy's inquiry for one connection: a network connection is recorded once per direction.
void AddPeer(const TopologyView& topo, int rank, int peer, int* n, int* peers) {
  if (!OnOtherNode(topo, rank, peer)) return;
  for (int i = 0; i < *n; ++i) {
    if (peers[i] == peer) return;
  }
  if (*n < ProxyOp::kMaxPeers) peers[(*n)++] = peer;
}

// NeedProxy: rings always use both connections; a pipeline from the root does not receive on
// the root nor send to it, a pipeline to the root does not receive from it nor send on it.
bool RingNeedsRecv(Pattern pattern, int root, int rank, int prev) {
  if (pattern == Pattern::kPipelineFrom) return root != rank;
  if (pattern == Pattern::kPipelineTo) return root != prev;
  return true;
}
bool RingNeedsSend(Pattern pattern, int root, int rank, int next) {
  if (pattern == Pattern::kPipelineFrom) return root != next;
  if (pattern == Pattern::kPipelineTo) return root != rank;
  return true;
}

// The tree neighbours of `rank` (see the top of the file): the parent (-1 at the root) and the
// children (-1 where none).
void TreeNeighbours(int rank, int nRanks, int* up, int down[3]) {
  *up = rank - 1;
  down[0] = rank + 1 < nRanks ? rank + 1 : -1;
  down[1] = down[2] = -1;
}

}  // namespace

ProxyOp InitCollProxyOp(const PlanContext& ctx, const CollInfo& info, int channelId,
                        uint64_t opCount, uint32_t nsteps) {
  ProxyOp op;
  op.channelId = channelId;
  op.task = info.index;
  op.coll = info.coll;
  op.pattern = info.pattern;
  op.protocol = info.proto;
  op.dtype = info.dtype;
  // The network sees an average or a scaled sum as a sum.
  const bool scaled =
      info.opFull.op == DevRedOp::kPreMulSum || info.opFull.op == DevRedOp::kSumPostDiv;
  op.redOp = scaled ? int32_t(kSum) : int32_t(info.opFull.proxyOp);
  op.root = info.root;
  op.nsteps = nsteps;
  op.chunkSize = info.chunkSize;
  op.chunkSteps = info.chunkSteps;
  op.sliceSteps = info.sliceSteps;
  // P2p uses nbytes to size its receive buffer; a collective may move more than its bytes, so
  // it is one slice here.
  op.nbytes = int64_t(info.stepSize) * info.sliceSteps;
  op.opCount = opCount;
  op.connIndex = 0;
  if (info.proto == Proto::kSimple && info.algo == Algo::kRing && ctx.params.useIntraNet &&
      info.nBytes > ctx.params.intraNetThreshold) {
    op.connIndex = kConnIdxP2pNet;
  }
  return op;
}

ProxyOp InitP2pProxyOp(const P2pInfo& task, int channelId, Proto proto, int64_t bytes,
                       int64_t chunkSize, int connIndex) {
  ProxyOp op;
  op.channelId = channelId;
  op.task = task.index;
  op.coll = task.isSend ? Coll::kSend : Coll::kRecv;
  op.pattern = Pattern::kP2p;
  op.protocol = proto;
  op.dtype = DataType::kInt8;  // p2p moves bytes
  op.redOp = kSum;
  op.root = task.peer;
  op.peer = task.peer;
  op.connIndex = connIndex;
  op.chunkSize = chunkSize;
  op.chunkSteps = 1;
  op.sliceSteps = 1;
  // An LL step carries half its bytes as data, and the FIFO holds whole 16-byte lines.
  int64_t chunkEffective = chunkSize;
  int64_t nbytes = bytes;
  if (proto == Proto::kLL) {
    chunkEffective /= 2;
    nbytes = DivUp(nbytes * 2, kLLLineBytes) * kLLLineBytes;
  }
  op.nbytes = std::min(nbytes, chunkSize);
  // A zero-byte piece (a sync) still takes one step.
  const int64_t nsteps = chunkEffective > 0 ? DivUp(bytes, chunkEffective) : 0;
  op.nsteps = uint32_t(std::clamp<int64_t>(nsteps, 1, std::numeric_limits<uint32_t>::max()));
  return op;
}

bool AddProxyOpIfNeeded(const PlanContext& ctx, KernelPlan* kp, ProxyOp op) {
  const TopologyView& topo = ctx.topo;
  const int rank = ctx.rank;
  const int n = topo.nRanks;
  op.nRecvPeers = op.nSendPeers = 0;
  switch (op.pattern) {
    case Pattern::kRing:
    case Pattern::kRingTwice:
    case Pattern::kPipelineFrom:
    case Pattern::kPipelineTo: {
      const int prev = (rank + n - 1) % n, next = (rank + 1) % n;
      if (RingNeedsRecv(op.pattern, op.root, rank, prev)) {
        AddPeer(topo, rank, prev, &op.nRecvPeers, op.recvPeers);
      }
      if (RingNeedsSend(op.pattern, op.root, rank, next)) {
        AddPeer(topo, rank, next, &op.nSendPeers, op.sendPeers);
      }
      break;
    }
    case Pattern::kTreeUp:
    case Pattern::kTreeDown:
    case Pattern::kTreeUpDown: {
      int up, down[3];
      TreeNeighbours(rank, n, &up, down);
      if (op.pattern != Pattern::kTreeDown) {  // reduce up: from the children to the parent
        for (int d : down) AddPeer(topo, rank, d, &op.nRecvPeers, op.recvPeers);
        AddPeer(topo, rank, up, &op.nSendPeers, op.sendPeers);
      }
      if (op.pattern != Pattern::kTreeUp) {  // broadcast down: from the parent to the children
        for (int d : down) AddPeer(topo, rank, d, &op.nSendPeers, op.sendPeers);
        AddPeer(topo, rank, up, &op.nRecvPeers, op.recvPeers);
      }
      break;
    }
    case Pattern::kP2p:
      if (op.coll == Coll::kSend) {
        AddPeer(topo, rank, op.peer, &op.nSendPeers, op.sendPeers);
      } else {
        AddPeer(topo, rank, op.peer, &op.nRecvPeers, op.recvPeers);
      }
      break;
    case Pattern::kDirect:  // one node only: no connections at all
      break;
  }
  if (op.nRecvPeers == 0 && op.nSendPeers == 0) return false;
  kp->channels[op.channelId].proxyOps.push_back(op);
  return true;
}

std::vector<ProxyOp> ProxyOpsInUploadOrder(const KernelPlan& kp) {
  // Merge the channels' queues (each already in opCount order) by opCount with the tag bit
  // rotated to the top: every collective (tag 0) before every p2p op (tag 1); among equal keys
  // the lowest channel first.
  size_t total = 0;
  for (int c = 0; c < kMaxChannels; ++c) total += kp.channels[c].proxyOps.size();
  std::vector<ProxyOp> out;
  out.reserve(total);
  std::vector<size_t> head(kMaxChannels, 0);
  auto key = [](uint64_t id) { return id >> 1 | id << 63; };
  while (out.size() < total) {
    int minChan = -1;
    uint64_t minKey = std::numeric_limits<uint64_t>::max();
    for (int c = 0; c < kMaxChannels; ++c) {
      const auto& q = kp.channels[c].proxyOps;
      if (head[c] >= q.size()) continue;
      const uint64_t k = key(q[head[c]].opCount);
      if (minChan < 0 || k < minKey) {
        minChan = c;
        minKey = k;
      }
    }
    out.push_back(kp.channels[minChan].proxyOps[head[minChan]++]);
  }
  return out;
}

std::vector<ProxyOp> UploadProxyOps(const KernelPlan& kp, ProxyOpCounters* counters) {
  std::vector<ProxyOp> ops = ProxyOpsInUploadOrder(kp);
  uint64_t p2pBump[kMaxChannels] = {};
  for (ProxyOp& op : ops) {
    const uint64_t id = op.opCount;
    if (id & 1) {
      // A channel's p2p opCounts grow within the plan: the last one gives the bump.
      p2pBump[op.channelId] = (id >> 1) + 1;
      op.opCount = (counters->p2pOpCount[op.channelId] << 1) + id;
    } else {
      op.opCount = (counters->collOpCount << 1) + id;
    }
  }
  counters->collOpCount += uint64_t(kp.collOpCount);
  for (int c = 0; c < kMaxChannels; ++c) counters->p2pOpCount[c] += p2pBump[c];
  return ops;
}

}  // namespace jax_rccl
