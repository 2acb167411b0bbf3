// The collective kernels (device code only; included by the per-type translation units that
// hip/gen_kernels.py writes, one kernel per element type so that they compile in parallel and each
// stays small): one block per channel of a launch walks that channel's works (a
// persistent plan's work array), running each work element's primitive program
// (ffi/compute/coll_program.h) through the connection FIFOs of hip/device_conn.h with the element's
// protocol, a type (hip/kernel_proto.h: ProtoSimple, ProtoLL, ProtoLL128) chosen once per element:
//   - Simple: the sender waits for room (head), writes a step into the receiver's slot, fences,
//     and publishes tail; the receiver waits for tail, reads the slot, and publishes head.
//   - LL: 16-byte lines of two (data, flag) words stored in single accesses; the flag is the step
//     number + 1, so the receiver waits on each line's flags instead of a tail, and no fence is
//     needed. Half of an LL slot is data.
//   - LL128 (NVIDIA): 128-byte lines of 15 data words and a flag word, moved by eight lanes.
// Point-to-point works hold a send and a receive that progress interleaved (a block never
// blocks on one while the other could move), so every schedule of peers completes.
//
// Every wait polls the communicator's abort word and a deadline (JAX_RCCL_TIMEOUT from the
// launch's start); a wait that passes it reports the channel, peer and step in the rank's
// DevStatus, raises the abort word and the kernel returns: an error, never a hang.
//
// Nothing of the launch depends on host state at run time: step counters live in the
// connection headers, so a captured launch may be replayed any number of times.
//
// The pieces live in hip/kernel_piece.h, Direct in hip/kernel_direct.h.
#pragma once

#include <stdint.h>

#include "hip/kernel_direct.h"
#include "hip/kernel_piece.h"

namespace jax_rccl {
namespace gpu {
namespace {

// The primitive program of a ring or tree element with protocol P: each primitive moved through
// the FIFO in pieces of one step.
template <typename F, typename P>
__device__ __noinline__ bool RunProgram(const KernelArgs& a, uint64_t deadline, int ch,
                                        const WorkElemColl& e, const DevTask& t, BlockShared* sh) {
  const Pattern pattern = Pattern(t.pattern);
  const SlotPtrs sp = GetSlot(a, e.slot);
  const F fn(TaskOpArg(t, sp));
  const int64_t nOps = CollOpCount(pattern, e, a.nRanks);
  const int64_t cap = StepCap<P>(a, t.unitSize);
  for (int64_t i = 0; i < nOps; ++i) {
    const Prim p = CollPrim(Coll(t.coll), pattern, e, a.rank, a.nRanks, i);
    const int64_t nPieces = PieceCount(p.n, cap);
    const int64_t pu = PieceUnits(p.n, nPieces);
    for (int64_t k = 0; k < nPieces; ++k) {
      const int64_t lo = k * pu;
      const int64_t m = ProgMax(0, ProgMin(pu, p.n - lo));
      if (!DoPiece<F, P>(fn, a, deadline, ch, p, lo, m, t.unitSize, sp, sh)) return false;
      __syncthreads();
    }
  }
  return true;
}

// One function per (type, op), not inlined into the kernel: keeps the device compiler's work
// linear in the number of instantiations. The element's protocol is chosen here, once.
template <typename F>
__device__ __noinline__ bool RunCollElem(const KernelArgs& a, uint64_t deadline, int ch,
                                         const WorkElemColl& e, const DevTask& t, BlockShared* sh) {
  Trace(a, sh, kTraceElem);
  if (Pattern(t.pattern) == Pattern::kDirect) return RunDirectElem<F>(a, deadline, ch, e, t, sh);
  return ByProto(t.proto, [&](auto proto) {
    return RunProgram<F, decltype(proto)>(a, deadline, ch, e, t, sh);
  });
}

template <typename T>
__device__ bool DispatchOp(const KernelArgs& a, uint64_t deadline, int ch, const WorkElemColl& e,
                           const DevTask& t, BlockShared* sh) {
  switch (DevRedOp(t.op)) {
    case DevRedOp::kSum:
      return RunCollElem<FuncSum<T>>(a, deadline, ch, e, t, sh);
    case DevRedOp::kProd:
      return RunCollElem<FuncProd<T>>(a, deadline, ch, e, t, sh);
    case DevRedOp::kMinMax:
      return RunCollElem<FuncMinMax<T>>(a, deadline, ch, e, t, sh);
    case DevRedOp::kPreMulSum:
      return RunCollElem<FuncPreMulSum<T>>(a, deadline, ch, e, t, sh);
    case DevRedOp::kSumPostDiv:
      return RunCollElem<FuncSumPostDiv<T>>(a, deadline, ch, e, t, sh);
  }
  return true;
}

// Element `e` of a ragged_all_to_all transfer as this launch runs it: its bytes cut to what the
// table's entry moves (ScaledEdge) and the slot's pointer moved to the entry's rows. Both ends read
// the same entry (the sender's slice and the receiver's recv_sizes), so they cut alike; an entry
// out of range moves nothing on both ends and is reported (kDevBadRagged) to the host, which
// raises it at the rank's next call. False: the element moves nothing this launch.
__device__ bool RaggedElem(const KernelArgs& a, int ch, WorkElemP2p* e, SlotPtrs* sp) {
  const DevTask t = a.tasks[e->slot];
  if (t.argKind != kArgRagged) return true;
  const RaggedDims& d = a.ragged;
  const int s = RaggedSender(t.opArg);
  const int64_t i = RaggedSlice(t.opArg), K = d.slices, spd = K / a.nRanks;
  const int dst = int(i / spd);
  auto entry = [&](int rank, int field, int64_t slice) -> int64_t {
    const int64_t at = (int64_t(rank) * 4 + field) * K + slice;
    return d.table64 ? static_cast<const int64_t*>(sp->table)[at]
                     : int64_t(static_cast<const int32_t*>(sp->table)[at]);
  };
  const int64_t inOff = entry(s, 0, i), size = entry(s, 1, i), outOff = entry(s, 2, i);
  const int64_t expect = entry(dst, 3, int64_t(s) * spd + i % spd);
  const bool ok = inOff >= 0 && size >= 0 && outOff >= 0 && inOff <= d.inRows &&
                  size <= d.inRows - inOff && outOff <= d.outRows && size <= d.outRows - outOff &&
                  size == expect;
  const bool send = e->p2pType == kWorkP2pTypeSend;
  if (!ok) {
    if (threadIdx.x == 0 && atomicCAS(&a.status->code, kDevFine, kDevBadRagged) == kDevFine) {
      a.status->rank = a.rank;
      a.status->channel = ch;
      a.status->peer = s;
      a.status->waitingRecv = send ? 0 : 1;
      a.status->step = uint64_t(i);
    }
    e->countHi = e->countLo = 0;
    return false;
  }
  const int64_t planned = ProgMin(d.inRows, d.outRows) * d.rowBytes;
  const int64_t base = int64_t((uint64_t(e->offsetHi) << 32) | e->offsetLo);
  const int64_t count = int64_t((uint64_t(e->countHi) << 32) | e->countLo);
  const int64_t bytes = size * d.rowBytes;
  const int64_t lo = ScaledEdge(base, planned, bytes);
  const int64_t cut = ProgMax(0, ScaledEdge(base + count, planned, bytes) - lo);
  e->offsetLo = uint32_t(uint64_t(lo) & 0xffffffffu);
  e->offsetHi = uint32_t(uint64_t(lo) >> 32) & 0xffffu;
  e->countHi = uint32_t(uint64_t(cut) >> 32);
  e->countLo = uint32_t(uint64_t(cut) & 0xffffffffu);
  if (send) {
    sp->send = static_cast<const char*>(sp->send) + inOff * d.rowBytes;
  } else {
    sp->recv = static_cast<char*>(sp->recv) + outOff * d.rowBytes;
  }
  return cut > 0;
}

// One element of a p2p work (a send or a receive) and how far it got: op `op` of `nOps`, piece
// `piece` of that op.
struct P2pLane {
  WorkElemP2p e;
  SlotPtrs sp;
  int64_t op, piece, nOps;
};

// Tries the next piece of lane k with protocol P: moves it when its step is ready now (a receive:
// the step's data, P::DataReady; a send: room in the peer's FIFO). 1: moved, 0: not ready yet,
// -1: a wait gave up.
template <typename P>
__device__ __noinline__ int P2pTryPiece(const KernelArgs& a, uint64_t deadline, int ch,
                                        P2pLane* lanes, int k, BlockShared* sh) {
  const FuncSum<uint8_t> fn(0);
  P2pLane& l = lanes[k];
  const Prim p = P2pPrim(l.e, l.op);
  const int64_t cap = StepCap<P>(a, 1);
  const int64_t nPieces = PieceCount(p.n, cap);
  const int64_t pu = PieceUnits(p.n, nPieces);
  const int64_t lo = l.piece * pu;
  const int64_t m = ProgMax(0, ProgMin(pu, p.n - lo));
  if (threadIdx.x == 0) {
    bool ready;
    if (p.flags & kRecv) {
      const uint64_t rs = LoadVolatile64(&RecvConn(a, ch, p.recvPeer)->head);
      // An empty piece has no lines to look at, and a peer of another host's lines arrive by a
      // copy: tail says the step is there.
      ready = m > 0 && !PeerProxied(a, p.recvPeer) ? P::DataReady(a, ch, p.recvPeer, rs)
                                                   : ProtoSimple::DataReady(a, ch, p.recvPeer, rs);
    } else {
      ready = LoadVolatile64(SendTailMine(a, ch, p.sendPeer)) <
              LoadVolatile64(SendHeadMine(a, ch, p.sendPeer)) + kSteps;
    }
    sh->ready[k] = ready ? 1 : 0;
  }
  __syncthreads();
  const bool ready = sh->ready[k] != 0;
  __syncthreads();
  if (!ready) return 0;
  if (!DoPiece<FuncSum<uint8_t>, P>(fn, a, deadline, ch, p, lo, m, 1, l.sp, sh)) return -1;
  __syncthreads();
  if (++l.piece == nPieces) {
    l.piece = 0;
    ++l.op;
  }
  return 1;
}

// The lanes of a p2p work progressing interleaved, lane 0 with protocol P0 and lane 1 with P1 (a
// block never blocks on one while the other could move, so every schedule of peers completes).
template <typename P0, typename P1>
__device__ __noinline__ bool RunP2pLanes(const KernelArgs& a, uint64_t deadline, int ch,
                                         P2pLane* lanes, int nEl, BlockShared* sh) {
  int idle = 0;
  while (true) {
    bool allDone = true;
    bool progressed = false;
    for (int k = 0; k < nEl; ++k) {
      if (lanes[k].op >= lanes[k].nOps) continue;
      allDone = false;
      const int moved = k == 0 ? P2pTryPiece<P0>(a, deadline, ch, lanes, 0, sh)
                               : P2pTryPiece<P1>(a, deadline, ch, lanes, 1, sh);
      if (moved < 0) return false;
      if (moved > 0) progressed = true;
    }
    if (allDone) break;
    if (!progressed && ++idle == kSpinsPerAbortCheck) {
      idle = 0;
      if (threadIdx.x == 0) {
        const WorkElemP2p& e = lanes[0].e;
        sh->ok = ShouldStop(a, deadline, ch, e.peer, e.p2pType == kWorkP2pTypeRecv, 0) ? 0 : 1;
      }
      __syncthreads();
      if (!sh->ok) return false;
      __syncthreads();
    }
  }
  return true;
}

// A send and a receive of one p2p work, interleaved; a send to and a receive from this rank in the
// same work are a copy. A ragged_all_to_all element whose cut is empty takes no FIFO step (its
// peer's cuts the same way). Each element's protocol is chosen once, here.
__device__ __noinline__ bool RunP2pWork(const KernelArgs& a, uint64_t deadline, int ch,
                                        const Work& w, BlockShared* sh) {
  P2pLane lanes[2];
  bool moves[2] = {true, true};
  int nEl = 0;
  for (int k = 0; k < kMaxWorkElementsP2p; ++k) {
    const WorkElemP2p& p = w.p2pElems[k];
    if (p.p2pType != kWorkP2pTypeSend && p.p2pType != kWorkP2pTypeRecv) continue;
    lanes[nEl].e = p;
    lanes[nEl].sp = GetSlot(a, p.slot);
    if (a.ragged.slices > 0) moves[nEl] = RaggedElem(a, ch, &lanes[nEl].e, &lanes[nEl].sp);
    ++nEl;
  }
  if (nEl == 2 && lanes[0].e.peer == a.rank && lanes[1].e.peer == a.rank) {
    const int si = lanes[0].e.p2pType == kWorkP2pTypeSend ? 0 : 1;
    const WorkElemP2p& s = lanes[si].e;
    const WorkElemP2p& r = lanes[1 - si].e;
    const int64_t bytes = int64_t((uint64_t(s.countHi) << 32) | s.countLo);
    const char* from = static_cast<const char*>(lanes[si].sp.send) +
                       int64_t((uint64_t(s.offsetHi) << 32) | s.offsetLo);
    char* to = static_cast<char*>(lanes[1 - si].sp.recv) +
               int64_t((uint64_t(r.offsetHi) << 32) | r.offsetLo);
    if (from != to && bytes > 0) {
      const FuncSum<uint8_t> fn(0);
      PieceIo io;
      io.src = from;
      io.dst = to;
      SimpleLoop<FuncSum<uint8_t>, false, true>(fn, io, bytes);
    }
    return true;
  }
  for (int k = 0; k < nEl; ++k) {
    lanes[k].op = lanes[k].piece = 0;
    lanes[k].nOps = moves[k] ? P2pOpCount(lanes[k].e) : 0;
  }
  const int proto0 = nEl > 0 ? int(lanes[0].e.proto) & 3 : kProtoSimple;
  const int proto1 = nEl > 1 ? int(lanes[1].e.proto) & 3 : proto0;
  return ByProto(proto0, [&](auto p0) {
    return ByProto(proto1, [&](auto p1) {
      return RunP2pLanes<decltype(p0), decltype(p1)>(a, deadline, ch, lanes, nEl, sh);
    });
  });
}

// The body of the kernel for one class of tasks: reductions over T (kClass = its DataType), or
// data movement (kClass = kCopyClass, T = uint8_t). Works of other classes are skipped: a plan
// holding several classes runs as one launch per class, in class order on every rank, so every
// connection sees the same sequence of steps on both of its ends.
template <typename T, int kClass>
__device__ void CollKernelBody(const KernelArgs& a) {
  // The work and the launch's tasks (up to kSharedTasks) are copied in 16-byte words, in one pass
  // for the first work: the arrays are uint4 so that every store is aligned.
  constexpr int kWorkWords = int(sizeof(Work) / 16);
  static_assert(sizeof(DevTask) == 16, "a task is one 16-byte word");
  __shared__ uint4 workWords[kWorkWords];
  __shared__ uint4 taskWords[kSharedTasks];
  __shared__ BlockShared sh;
  __shared__ int orderOk;  // deviceCheck: this rank's device is its partition's (DeviceOrderOk)
  const Work& work = *reinterpret_cast<const Work*>(workWords);
  const DevTask* tasks = reinterpret_cast<const DevTask*>(taskWords);
  const bool tasksShared = a.nSlots <= kSharedTasks;
  // The call's number (hip/kernel_check.h), loaded first: its address needs no other load.
  const uint64_t callSeq = threadIdx.x == 0 ? LoadCallSeq(a) : 0;
  const BlockInfo bi = a.blocks[blockIdx.x];
  const uint64_t deadline = NowNs() + a.timeoutNs;
  if (threadIdx.x == 0) {
    sh.nConn = 0;
    sh.victim = 0;
    sh.nTrace = 0;
  }
  Trace(a, &sh, kTraceStart);
  int wi = bi.firstWork;
  int nCopy = kWorkWords + (tasksShared ? a.nSlots : 0);
  bool firstWork = true;
  while (true) {
    const uint4* from = reinterpret_cast<const uint4*>(a.works + wi);
    for (int i = threadIdx.x; i < nCopy; i += blockDim.x) {
      if (i < kWorkWords) {
        workWords[i] = from[i];
      } else {
        taskWords[i - kWorkWords] = reinterpret_cast<const uint4*>(a.tasks)[i - kWorkWords];
      }
    }
    nCopy = kWorkWords;
    if (firstWork && threadIdx.x == 0) {
      SetCall(a, callSeq);
      if (a.deviceCheck != nullptr) orderOk = DeviceOrderOk(a) ? 1 : 0;
    }
    __syncthreads();
    // An exported program called on its devices in another order moves nothing
    // (hip/kernel_check.h).
    if (firstWork && a.deviceCheck != nullptr && orderOk == 0) return;
    if (firstWork) AdvanceCall(a);
    firstWork = false;
    Trace(a, &sh, kTraceWork);
    bool ok = true;
    if (work.header.type == kWorkTypeColl) {
      const WorkElemColl& e = work.elems[0];
      if (e.isUsed) {
        const DevTask& t = tasksShared ? tasks[e.slot] : a.tasks[e.slot];
        const int cls = t.copy ? kCopyClass : int(t.dtype);
        if (cls == kClass) {
          if constexpr (kClass == kCopyClass) {
            ok = RunCollElem<FuncSum<uint8_t>>(a, deadline, bi.channel, e, t, &sh);
          } else {
            ok = DispatchOp<T>(a, deadline, bi.channel, e, t, &sh);
          }
        }
      }
    } else if (work.header.type == kWorkTypeP2p) {
      if constexpr (kClass == kCopyClass) ok = RunP2pWork(a, deadline, bi.channel, work, &sh);
    }
    if (!ok) return;
    const bool last = work.header.isLast;
    const int next = work.header.workNext;
    __syncthreads();
    if (last) break;
    wi = next;
  }
  Trace(a, &sh, kTraceEnd);
}

}  // namespace

// The one-rank path and slot tables need no FIFOs: a plain element-wise copy.
#define JR_DEFINE_COLL_KERNEL(name, cls, T)                    \
  __global__ void __launch_bounds__(kMaxLaunchThreads, 1)      \
      CollKernel_##name(const JR_GRID_CONSTANT KernelArgs a) { \
    CollKernelBody<T, cls>(a);                                 \
  }

#define JR_DEFINE_COPY_KERNELS()                                          \
  JR_DEFINE_COLL_KERNEL(copy, kCopyClass, uint8_t)                        \
  __global__ void CopyKernel(const char* from, char* to, int64_t bytes) { \
    CopyBody(from, to, bytes);                                            \
  }

__device__ inline void CopyBody(const char* from, char* to, int64_t bytes) {
  PieceIo io;
  io.src = from;
  io.dst = to;
  const FuncSum<uint8_t> fn(0);
  const int64_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const int64_t lo = per * blockIdx.x;
  const int64_t n = lo < bytes ? (bytes - lo < per ? bytes - lo : per) : 0;
  io.src = from + lo;
  io.dst = to + lo;
  if (n > 0) SimpleLoop<FuncSum<uint8_t>, false, true>(fn, io, n);
}

}  // namespace gpu
}  // namespace jax_rccl
