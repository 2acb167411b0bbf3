// The collective kernels (device code only; included by the per-type translation units under
// hip/kernels/, one kernel per element type so that they compile in parallel and each stays
// small): one block per channel of a launch walks that channel's works (a
// persistent plan's work array), running each work element's primitive program
// (ffi/compute/coll_program.h) through the connection FIFOs of hip/device_conn.h with the element's
// protocol:
//   - Simple: the sender waits for room (head), writes a step into the receiver's slot, fences,
//     and publishes tail; the receiver waits for tail, reads the slot, and publishes head.
//   - LL: 16-byte lines of two (data, flag) words stored in single accesses; the flag is the step
//     number + 1, so the receiver waits on each line's flags instead of a tail, and no fence is
//     needed. Half of an LL slot is data.
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

// One function per (type, op), not inlined into the kernel: keeps the device compiler's work
// linear in the number of instantiations.
template <typename F>
__device__ __noinline__ bool RunCollElem(const KernelArgs& a, uint64_t deadline, int ch,
                                         const WorkElemColl& e, const DevTask& t, BlockShared* sh) {
  Trace(a, sh, kTraceElem);
  const Pattern pattern = Pattern(t.pattern);
  if (pattern == Pattern::kDirect) return RunDirectElem<F>(a, deadline, ch, e, t, sh);
  const SlotPtrs sp = GetSlot(a, e.slot);
  const F fn(TaskOpArg(t, sp));
  const int64_t nOps = CollOpCount(pattern, e, a.nRanks);
  const int64_t cap = StepCap(a, t.proto, t.unitSize);
  for (int64_t i = 0; i < nOps; ++i) {
    const Prim p = CollPrim(Coll(t.coll), pattern, e, a.rank, a.nRanks, i);
    const int64_t nPieces = PieceCount(p.n, cap);
    const int64_t pu = PieceUnits(p.n, nPieces);
    for (int64_t k = 0; k < nPieces; ++k) {
      const int64_t lo = k * pu;
      const int64_t m = ProgMax(0, ProgMin(pu, p.n - lo));
      if (!DoPiece(fn, a, deadline, ch, t.proto, p, lo, m, t.unitSize, sp, sh)) return false;
      __syncthreads();
    }
  }
  return true;
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

// A send and a receive of one p2p work, interleaved; a send to and a receive from this rank in the
// same work are a copy. A ragged_all_to_all element whose cut is empty takes no FIFO step (its
// peer's cuts the same way).
__device__ __noinline__ bool RunP2pWork(const KernelArgs& a, uint64_t deadline, int ch,
                                        const Work& w, BlockShared* sh) {
  const FuncSum<uint8_t> fn(0);
  WorkElemP2p el[2];
  SlotPtrs sp[2];
  bool moves[2] = {true, true};
  int nEl = 0;
  for (int k = 0; k < kMaxWorkElementsP2p; ++k) {
    const WorkElemP2p& p = w.p2pElems[k];
    if (p.p2pType != kWorkP2pTypeSend && p.p2pType != kWorkP2pTypeRecv) continue;
    el[nEl] = p;
    sp[nEl] = GetSlot(a, p.slot);
    if (a.ragged.slices > 0) moves[nEl] = RaggedElem(a, ch, &el[nEl], &sp[nEl]);
    ++nEl;
  }
  if (nEl == 2 && el[0].peer == a.rank && el[1].peer == a.rank) {
    const int si = el[0].p2pType == kWorkP2pTypeSend ? 0 : 1;
    const WorkElemP2p& s = el[si];
    const WorkElemP2p& r = el[1 - si];
    const int64_t bytes = int64_t((uint64_t(s.countHi) << 32) | s.countLo);
    const char* from =
        static_cast<const char*>(sp[si].send) + int64_t((uint64_t(s.offsetHi) << 32) | s.offsetLo);
    char* to =
        static_cast<char*>(sp[1 - si].recv) + int64_t((uint64_t(r.offsetHi) << 32) | r.offsetLo);
    if (from != to && bytes > 0) {
      PieceIo io;
      io.src = from;
      io.dst = to;
      SimpleLoop<FuncSum<uint8_t>, false, true>(fn, io, bytes);
    }
    return true;
  }
  int64_t op[2] = {0, 0}, piece[2] = {0, 0};
  int64_t nOps[2] = {0, 0};
  for (int k = 0; k < nEl; ++k) nOps[k] = moves[k] ? P2pOpCount(el[k]) : 0;
  int idle = 0;
  while (true) {
    bool allDone = true;
    bool progressed = false;
    for (int k = 0; k < nEl; ++k) {
      if (op[k] >= nOps[k]) continue;
      allDone = false;
      const WorkElemP2p& e = el[k];
      const int proto = int(e.proto) & 3;
      const Prim p = P2pPrim(e, op[k]);
      const int64_t cap = StepCap(a, proto, 1);
      const int64_t nPieces = PieceCount(p.n, cap);
      const int64_t pu = PieceUnits(p.n, nPieces);
      const int64_t lo = piece[k] * pu;
      const int64_t m = ProgMax(0, ProgMin(pu, p.n - lo));
      if (threadIdx.x == 0) {
        bool ready;
        if (p.flags & kRecv) {
          ConnHeader* c = RecvConn(a, ch, p.recvPeer);
          const uint64_t rs = LoadVolatile64(&c->head);
          if (proto == kProtoLL && m > 0) {
            const uint4 line = LoadVolatile(
                reinterpret_cast<const uint4*>(RecvSlot(a, ch, p.recvPeer, proto, rs)));
            ready = line.y == LLFlag(rs);
          } else if (proto == kProtoLL128 && m > 0) {
            // The first line's flag word: the upper half of its lane-7 access.
            const uint4 q = LoadVolatile(
                reinterpret_cast<const uint4*>(RecvSlot(a, ch, p.recvPeer, proto, rs)) + 7);
            ready = HiWord(q) == LL128Flag(rs);
          } else {
            ready = LoadVolatile64(&c->tail) > rs;
          }
        } else {
          ready = LoadVolatile64(SendTailMine(a, ch, p.sendPeer)) <
                  LoadVolatile64(SendHeadMine(a, ch, p.sendPeer)) + kSteps;
        }
        sh->ready[k] = ready ? 1 : 0;
      }
      __syncthreads();
      const bool ready = sh->ready[k] != 0;
      __syncthreads();
      if (!ready) continue;
      if (!DoPiece(fn, a, deadline, ch, proto, p, lo, m, 1, sp[k], sh)) return false;
      __syncthreads();
      progressed = true;
      if (++piece[k] == nPieces) {
        piece[k] = 0;
        ++op[k];
      }
    }
    if (allDone) break;
    if (!progressed && ++idle == kSpinsPerAbortCheck) {
      idle = 0;
      if (threadIdx.x == 0) {
        const WorkElemP2p& e = el[0];
        sh->ok = ShouldStop(a, deadline, ch, e.peer, e.p2pType == kWorkP2pTypeRecv, 0) ? 0 : 1;
      }
      __syncthreads();
      if (!sh->ok) return false;
      __syncthreads();
    }
  }
  return true;
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
  const Work& work = *reinterpret_cast<const Work*>(workWords);
  const DevTask* tasks = reinterpret_cast<const DevTask*>(taskWords);
  const bool tasksShared = a.nSlots <= kSharedTasks;
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
    __syncthreads();
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
