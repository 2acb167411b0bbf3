// The piece machinery of the collective kernels (see hip/kernel_impl.h): a block's view of its
// connections (BlockShared, the connection cache), the timeline (Trace) and DoPiece, which moves
// one FIFO step of a primitive with a given protocol. The parts it stands on, one header each:
// hip/kernel_addr.h (addressing and waits), hip/kernel_simple.h, hip/kernel_ll.h and
// hip/kernel_ll128.h (the data paths), hip/kernel_proto.h (the protocols as types). Device code
// only.
#pragma once

#include <stdint.h>

#include "hip/kernel_proto.h"

namespace jax_rccl {
namespace gpu {
namespace {

// Thread 0's view of the connection ends this block uses. The block is the only writer of its
// own step counters (the tail it sends on, the head it receives on) for the whole launch, so it
// keeps them here and writes them through to the headers; the peer's counter (the tail it
// waits on, the head it needs for room) is re-read only when the last value seen is not enough.
// Each piece then costs the waiting side one poll and the other side none.
constexpr int kConnCache = 8;
struct BlockShared {
  uint64_t rs, ss;
  int ok;    // written by thread 0 before a piece's first barrier
  int fail;  // written by any thread between a piece's barriers (an LL wait gave up)
  int ready[2];
  int nConn, victim;
  int nTrace;  // timeline words this block wrote (KernelArgs::trace)
  int cPeer[kConnCache];
  int cSend[kConnCache];
  uint64_t cStep[kConnCache];  // this block's counter: head (receiving) or tail (sending)
  uint64_t cSeen[kConnCache];  // the peer's counter last seen: tail (receiving) or head (sending)
};

// Thread 0 records `event` in the launch's timeline, when the launch has one.
__device__ inline void Trace(const KernelArgs& a, BlockShared* sh, uint32_t event) {
  if (a.trace == nullptr || threadIdx.x != 0) return;
  const int i = sh->nTrace;
  if (i >= kTraceEvents) return;
  sh->nTrace = i + 1;
  a.trace[int64_t(blockIdx.x) * kTraceEvents + i] =
      (uint64_t(event) << 56) | (NowNs() & ((uint64_t(1) << 56) - 1));
}

// The cache entry of (send, peer), loaded from `own` on a miss; never evicts entry `pin` (the
// other end the same piece uses).
__device__ inline int ConnSlot(BlockShared* sh, bool send, int peer, const uint64_t* own,
                               int pin = -1) {
  for (int i = 0; i < sh->nConn; ++i) {
    if (sh->cPeer[i] == peer && sh->cSend[i] == int(send)) return i;
  }
  int i;
  if (sh->nConn < kConnCache) {
    i = sh->nConn++;
  } else {
    if (sh->victim == pin) sh->victim = (sh->victim + 1) % kConnCache;
    i = sh->victim;
    sh->victim = (sh->victim + 1) % kConnCache;
  }
  sh->cPeer[i] = peer;
  sh->cSend[i] = int(send);
  sh->cStep[i] = LoadVolatile64(own);
  sh->cSeen[i] = 0;
  return i;
}

// Units of one step of protocol P for elements of `unitSize` bytes.
template <typename P>
__device__ inline int64_t StepCap(const KernelArgs& a, int unitSize) {
  return P::DataBytes(a.geo.stepBytes[P::kId]) / unitSize;
}

// One piece of primitive `p` (units [lo, lo + m) of it): waits for its FIFO steps, moves the data,
// publishes the steps. Uniform across the block; false when a wait gave up.
template <typename F, typename P>
__device__ bool DoPiece(const F& fn, const KernelArgs& a, uint64_t deadline, int ch, const Prim& p,
                        int64_t lo, int64_t m, int unitSize, const SlotPtrs& sp, BlockShared* sh) {
  const bool recv = (p.flags & kRecv) != 0, send = (p.flags & kSend) != 0;
  int i = -1, j = -1;  // thread 0: the cache entries of this piece's two ends
  Trace(a, sh, kTracePiece);
  // A peer of another host: its steps arrive by the proxy's copy, which only tail orders.
  const bool recvTail = recv && (P::kTailSignals || PeerProxied(a, p.recvPeer));
  if (threadIdx.x == 0) {
    bool ok = true;
    uint64_t rs = 0, ss = 0;
    sh->fail = 0;
    if (recv) {
      ConnHeader* c = RecvConn(a, ch, p.recvPeer);
      i = ConnSlot(sh, false, p.recvPeer, &c->head);
      rs = sh->cStep[i];
      if (recvTail && sh->cSeen[i] < rs + 1) {
        ok = WaitAtLeast(&c->tail, rs + 1, a, deadline, ch, p.recvPeer, true, &sh->cSeen[i]);
      }
    }
    if (ok && send) {
      j = ConnSlot(sh, true, p.sendPeer, SendTailMine(a, ch, p.sendPeer), i);
      ss = sh->cStep[j];
      const uint64_t need = ss + 1 > uint64_t(kSteps) ? ss + 1 - kSteps : 0;
      if (sh->cSeen[j] < need) {
        ok = WaitAtLeast(SendHeadMine(a, ch, p.sendPeer), need, a, deadline, ch, p.sendPeer, false,
                         &sh->cSeen[j]);
      }
    }
    if (recvTail) {
      // A proxied step was written by the host: acquire at system scope.
      const bool proxied = PeerProxied(a, p.recvPeer);
      if (P::kTailSignals && !proxied) {
        __threadfence();
      } else {
        __threadfence_system();
      }
      // Its word says which call it belongs to (hip/kernel_check.h).
      if (ok) ok = CheckStepWord(a, RecvConn(a, ch, p.recvPeer), proxied, ch, p.recvPeer, rs);
    }
    Trace(a, sh, kTraceReady);
    sh->rs = rs;
    sh->ss = ss;
    sh->ok = ok ? 1 : 0;
  }
  __syncthreads();
  if (!sh->ok) return false;
  const uint64_t rs = sh->rs, ss = sh->ss;
  PieceIo io;
  if (recv) io.in = RecvSlot(a, ch, p.recvPeer, P::kId, rs);
  if (send) io.out = SendSlot(a, ch, p.sendPeer, P::kId, ss);
  if (p.flags & kSrcIn) io.src = static_cast<const char*>(sp.send) + (p.srcOff + lo) * unitSize;
  if (p.flags & kSrcOut) io.src = static_cast<const char*>(sp.recv) + (p.srcOff + lo) * unitSize;
  if (p.flags & kDst) io.dst = static_cast<char*>(sp.recv) + (p.dstOff + lo) * unitSize;
  io.pre = (p.flags & kSrcIn) != 0;
  io.post = (p.flags & kPostOp) != 0;
  const int64_t n = m * unitSize / int64_t(sizeof(typename F::Elem));
  bool ok = true;
  if (n > 0) {
    ok = RunPieceData<F, P>(fn, io, n, rs, ss, a, deadline, ch, recv ? p.recvPeer : p.sendPeer);
  }
  if (!ok) sh->fail = 1;
  __syncthreads();
  if (sh->fail) return false;
  Trace(a, sh, kTraceMoved);
  if (threadIdx.x == 0) {
    if (send) {
      ConnHeader* c = SendConn(a, ch, p.sendPeer);
      if (PeerProxied(a, p.sendPeer)) {
        // The proxy reads the step's protocol, size and tag, then its slot, once it sees tail.
        StoreVolatile64(&c->pad0[ss % kSteps],
                        ProxyInfo(P::kId, uint64_t(P::SlotBytes(m * unitSize)), gCallTag));
        __threadfence_system();
      } else if (P::kTailSignals) {
        if (a.checkCalls) StoreVolatile64(StepTagWord(c, ss), ProxyInfo(P::kId, 0, gCallTag));
        Fence(a);
      }
      StoreVolatile64(&c->tail, ss + 1);
      StoreVolatile64(SendTailMine(a, ch, p.sendPeer), ss + 1);
      sh->cStep[j] = ss + 1;
    }
    if (recv) {
      StoreVolatile64(&RecvConn(a, ch, p.recvPeer)->head, rs + 1);
      StoreVolatile64(HeadAtSender(a, ch, p.recvPeer), rs + 1);
      sh->cStep[i] = rs + 1;
    }
  }
  Trace(a, sh, kTracePosted);
  return true;
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
