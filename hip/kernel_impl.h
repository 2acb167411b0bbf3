// The collective kernels (device code only; included by the per-type translation units under
// hip/kernels/, one kernel per element type so that they compile in parallel and each stays
// small): one block per channel of a launch walks that channel's works (a
// persistent plan's work array), running each work element's primitive program
// (hip/coll_program.h) through the connection FIFOs of hip/device_conn.h with the element's
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
#pragma once

#include <stdint.h>

#include "hip/coll_program.h"
#include "hip/device_conn.h"
#include "hip/portability.h"
#include "hip/reduce_functors.h"

namespace jax_rccl {
namespace gpu {
namespace {

constexpr int kUnroll = 4;

__device__ inline SlotPtrs GetSlot(const KernelArgs& a, uint32_t slot) {
  return a.nSlots <= kInlineSlots ? a.inlineSlots[slot] : a.slotTable[slot];
}

__device__ inline ConnHeader* RecvConn(const KernelArgs& a, int ch, int peer) {
  return reinterpret_cast<ConnHeader*>(a.regions[a.rank] +
                                       RegionLayout::HeaderOffset(a.geo, ch, peer));
}
__device__ inline ConnHeader* SendConn(const KernelArgs& a, int ch, int peer) {
  return reinterpret_cast<ConnHeader*>(a.regions[peer] +
                                       RegionLayout::HeaderOffset(a.geo, ch, a.rank));
}
__device__ inline char* RecvSlot(const KernelArgs& a, int ch, int peer, int proto, uint64_t s) {
  return a.regions[a.rank] + RegionLayout::SlotOffset(a.geo, ch, peer, proto, s);
}
__device__ inline char* SendSlot(const KernelArgs& a, int ch, int peer, int proto, uint64_t s) {
  return a.regions[peer] + RegionLayout::SlotOffset(a.geo, ch, a.rank, proto, s);
}

// The sender's side of connection (ch, this rank -> peer) lives in this rank's own region, in the
// header of the reverse connection (ch, peer -> this rank), whose pads are otherwise unused (Direct
// uses the pads of the header from a rank to itself, indices below 8): its own copy of the tail it
// sent, and the head the peer consumed, which the peer writes there. Every counter a rank polls or
// reloads is then in its own memory; across GPUs only stores cross the link.
constexpr int kSendPad = 8;
__device__ inline uint64_t* SendTailMine(const KernelArgs& a, int ch, int peer) {
  return &RecvConn(a, ch, peer)->pad0[kSendPad];
}
__device__ inline uint64_t* SendHeadMine(const KernelArgs& a, int ch, int peer) {
  return &RecvConn(a, ch, peer)->pad1[kSendPad];
}
// Where this rank, receiving from `peer`, reports its head to that sender.
__device__ inline uint64_t* HeadAtSender(const KernelArgs& a, int ch, int peer) {
  return &SendConn(a, ch, peer)->pad1[kSendPad];
}

__device__ inline uint64_t LoadVolatile64(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}
__device__ inline void StoreVolatile64(uint64_t* p, uint64_t v) {
  *reinterpret_cast<volatile uint64_t*>(p) = v;
}

// Records the first failure of this rank and raises the communicator's abort word.
__device__ void Report(const KernelArgs& a, int code, int ch, int peer, bool recv, uint64_t step) {
  if (atomicCAS(&a.status->code, 0, code) == 0) {
    a.status->rank = a.rank;
    a.status->channel = ch;
    a.status->peer = peer;
    a.status->waitingRecv = recv ? 1 : 0;
    a.status->step = step;
    __threadfence_system();
  }
  *a.abort = 1;
}

// Whether to give up a wait: the abort word is raised, or the deadline passed (reported).
__device__ inline bool ShouldStop(const KernelArgs& a, uint64_t deadline, int ch, int peer,
                                  bool recv, uint64_t step) {
  if (*a.abort != 0) {
    if (atomicCAS(&a.status->code, 0, 2) == 0) {
      a.status->rank = a.rank;
      a.status->channel = ch;
      a.status->peer = peer;
      a.status->waitingRecv = recv ? 1 : 0;
      a.status->step = step;
    }
    return true;
  }
  if (NowNs() > deadline) {
    Report(a, 1, ch, peer, recv, step);
    return true;
  }
  return false;
}

// Spins until *p >= v (thread 0 only); *seen gets the value that satisfied it.
__device__ bool WaitAtLeast(const uint64_t* p, uint64_t v, const KernelArgs& a, uint64_t deadline,
                            int ch, int peer, bool recv, uint64_t* seen) {
  int spins = 0;
  uint64_t x;
  while ((x = LoadVolatile64(p)) < v) {
    if (++spins == 512) {
      spins = 0;
      if (ShouldStop(a, deadline, ch, peer, recv, v - 1)) return false;
    }
  }
  *seen = x;
  return true;
}

__device__ inline void Fence(const KernelArgs& a) {
  if (a.systemFence) {
    __threadfence_system();
  } else {
    __threadfence();
  }
}

// ---- data paths of one piece ----

template <typename T>
union Pack16 {
  uint4 v;
  T e[16 / sizeof(T)];
};
template <typename T>
union Word8 {
  uint64_t u;
  T e[8 / sizeof(T)];
  unsigned char b[8];
};

// One value: Reduce(in, PreOp(src)) / in / PreOp(src), then PostOp when `post`.
template <typename F, bool kIn, bool kSrc>
__device__ inline typename F::Elem Combine(const F& fn, typename F::Elem in, typename F::Elem src,
                                           bool pre, bool post) {
  using Tr = ElemTraits<typename F::Elem>;
  typename F::Acc v;
  if (kIn && kSrc) {
    typename F::Acc s = Tr::Load(src);
    if (F::kHasPreOp && pre) s = fn.PreOp(s);
    v = fn.Reduce(Tr::Load(in), s);
  } else if (kIn) {
    v = Tr::Load(in);
  } else {
    v = Tr::Load(src);
    if (F::kHasPreOp && pre) v = fn.PreOp(v);
  }
  if (F::kHasPostOp && post) v = fn.PostOp(v);
  return Tr::Store(v);
}

struct PieceIo {
  const char* in = nullptr;  // FIFO slot received
  const char* src = nullptr;
  char* dst = nullptr;
  char* out = nullptr;  // FIFO slot to send
  bool pre = false;
  bool post = false;
};

// Simple: 16-byte packs (when every pointer is 16-byte aligned), kUnroll packs in flight per
// thread, then the remaining elements one by one.
template <typename F, bool kIn, bool kSrc>
__device__ __noinline__ void SimpleLoop(const F& fn, const PieceIo& io, int64_t n) {
  using T = typename F::Elem;
  constexpr int kEpp = 16 / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  const uintptr_t mis =
      uintptr_t(io.in) | uintptr_t(io.src) | uintptr_t(io.dst) | uintptr_t(io.out);
  const int64_t nPacks = (mis & 15) == 0 ? n / kEpp : 0;
  const bool plain =
      !(kIn && kSrc) && !(F::kHasPreOp && io.pre && kSrc) && !(F::kHasPostOp && io.post);
  const uint4* in4 = reinterpret_cast<const uint4*>(io.in);
  const uint4* src4 = reinterpret_cast<const uint4*>(io.src);
  uint4* dst4 = reinterpret_cast<uint4*>(io.dst);
  uint4* out4 = reinterpret_cast<uint4*>(io.out);
  for (int64_t base = tid; base < nPacks; base += int64_t(kUnroll) * nt) {
    Pack16<T> a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t(u) * nt;
      if (i < nPacks) {
        if (kIn) a[u].v = LoadCG(in4 + i);
        if (kSrc) b[u].v = LoadCG(src4 + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t(u) * nt;
      if (i >= nPacks) continue;
      Pack16<T> r;
      if (plain) {
        r.v = kIn ? a[u].v : b[u].v;
      } else {
#pragma unroll
        for (int k = 0; k < kEpp; ++k) {
          r.e[k] = Combine<F, kIn, kSrc>(fn, a[u].e[k], b[u].e[k], io.pre, io.post);
        }
      }
      if (dst4 != nullptr) dst4[i] = r.v;
      if (out4 != nullptr) out4[i] = r.v;
    }
  }
  const T* inT = reinterpret_cast<const T*>(io.in);
  const T* srcT = reinterpret_cast<const T*>(io.src);
  T* dstT = reinterpret_cast<T*>(io.dst);
  T* outT = reinterpret_cast<T*>(io.out);
  for (int64_t i = nPacks * kEpp + tid; i < n; i += nt) {
    T x{}, y{};
    if (kIn) x = inT[i];
    if (kSrc) y = srcT[i];
    const T r = Combine<F, kIn, kSrc>(fn, x, y, io.pre, io.post);
    if (dstT != nullptr) dstT[i] = r;
    if (outT != nullptr) outT[i] = r;
  }
}

// LL: word w of the piece (bytes [8w, 8w + 8)) travels in line w: {lo, flag, hi, flag}.
template <typename F, bool kIn, bool kSrc>
__device__ __noinline__ bool LLLoop(const F& fn, const PieceIo& io, int64_t n, uint32_t inFlag,
                                    uint32_t outFlag, const KernelArgs& a, uint64_t deadline,
                                    int ch, int peer) {
  using T = typename F::Elem;
  constexpr int kEpw = 8 / sizeof(T);
  const int64_t bytes = n * int64_t(sizeof(T));
  const int64_t nWords = (bytes + 7) / 8;
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint4* inL = reinterpret_cast<const uint4*>(io.in);
  uint4* outL = reinterpret_cast<uint4*>(io.out);
  for (int64_t w = tid; w < nWords; w += nt) {
    const int wb = int(bytes - 8 * w < 8 ? bytes - 8 * w : 8);
    Word8<T> s, r, v;
    s.u = 0;
    r.u = 0;
    if (kSrc) {
      const char* p = io.src + 8 * w;
      if (wb == 8 && (uintptr_t(p) & 7) == 0) {
        s.u = LoadCG(reinterpret_cast<const uint64_t*>(p));
      } else {
        for (int k = 0; k < wb; ++k) s.b[k] = static_cast<unsigned char>(p[k]);
      }
    }
    if (kIn) {
      uint4 line = LoadVolatile(inL + w);
      int spins = 0;
      while (line.y != inFlag || line.w != inFlag) {
        if (++spins == 512) {
          spins = 0;
          if (ShouldStop(a, deadline, ch, peer, true, inFlag - 1)) return false;
        }
        line = LoadVolatile(inL + w);
      }
      r.u = uint64_t(line.x) | (uint64_t(line.z) << 32);
    }
#pragma unroll
    for (int k = 0; k < kEpw; ++k) {
      v.e[k] = Combine<F, kIn, kSrc>(fn, r.e[k], s.e[k], io.pre, io.post);
    }
    if (io.dst != nullptr) {
      char* p = io.dst + 8 * w;
      if (wb == 8 && (uintptr_t(p) & 7) == 0) {
        *reinterpret_cast<uint64_t*>(p) = v.u;
      } else {
        for (int k = 0; k < wb; ++k) p[k] = static_cast<char>(v.b[k]);
      }
    }
    if (outL != nullptr) {
      uint4 line;
      line.x = uint32_t(v.u);
      line.y = outFlag;
      line.z = uint32_t(v.u >> 32);
      line.w = outFlag;
      StoreVolatile(outL + w, line);
    }
  }
  return true;
}

template <typename F>
__device__ bool RunPieceData(const F& fn, const PieceIo& io, int64_t n, int proto, uint32_t inFlag,
                             uint32_t outFlag, const KernelArgs& a, uint64_t deadline, int ch,
                             int peer) {
  const bool hasIn = io.in != nullptr, hasSrc = io.src != nullptr;
  if (proto == kProtoLL) {
    if (hasIn && hasSrc)
      return LLLoop<F, true, true>(fn, io, n, inFlag, outFlag, a, deadline, ch, peer);
    if (hasIn) return LLLoop<F, true, false>(fn, io, n, inFlag, outFlag, a, deadline, ch, peer);
    return LLLoop<F, false, true>(fn, io, n, inFlag, outFlag, a, deadline, ch, peer);
  }
  if (hasIn && hasSrc) {
    SimpleLoop<F, true, true>(fn, io, n);
  } else if (hasIn) {
    SimpleLoop<F, true, false>(fn, io, n);
  } else {
    SimpleLoop<F, false, true>(fn, io, n);
  }
  return true;
}

// The flag of LL step `step`: never 0 (the value of lines never written), and, 2^32 - 1 being odd,
// a flag that comes round again lands in another slot than its last use.
__device__ inline uint32_t LLFlag(uint64_t step) {
  return 1u + uint32_t(step % 0xFFFFFFFFull);
}

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
  int cPeer[kConnCache];
  int cSend[kConnCache];
  uint64_t cStep[kConnCache];  // this block's counter: head (receiving) or tail (sending)
  uint64_t cSeen[kConnCache];  // the peer's counter last seen: tail (receiving) or head (sending)
};

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

// Units of one step of `proto` for elements of `unitSize` bytes.
__device__ inline int64_t StepCap(const KernelArgs& a, int proto, int unitSize) {
  const int64_t b = proto == kProtoLL ? a.geo.stepBytes[kProtoLL] / 2 : a.geo.stepBytes[proto];
  return b / unitSize;
}

// One piece of primitive `p` (units [lo, lo + m) of it): waits for its FIFO steps, moves the data,
// publishes the steps. Uniform across the block; false when a wait gave up.
template <typename F>
__device__ bool DoPiece(const F& fn, const KernelArgs& a, uint64_t deadline, int ch, int proto,
                        const Prim& p, int64_t lo, int64_t m, int unitSize, const SlotPtrs& sp,
                        BlockShared* sh) {
  const bool recv = (p.flags & kRecv) != 0, send = (p.flags & kSend) != 0;
  int i = -1, j = -1;  // thread 0: the cache entries of this piece's two ends
  if (threadIdx.x == 0) {
    bool ok = true;
    uint64_t rs = 0, ss = 0;
    sh->fail = 0;
    if (recv) {
      ConnHeader* c = RecvConn(a, ch, p.recvPeer);
      i = ConnSlot(sh, false, p.recvPeer, &c->head);
      rs = sh->cStep[i];
      if (proto != kProtoLL && sh->cSeen[i] < rs + 1) {
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
    if (recv && proto != kProtoLL) __threadfence();
    sh->rs = rs;
    sh->ss = ss;
    sh->ok = ok ? 1 : 0;
  }
  __syncthreads();
  if (!sh->ok) return false;
  const uint64_t rs = sh->rs, ss = sh->ss;
  PieceIo io;
  if (recv) io.in = RecvSlot(a, ch, p.recvPeer, proto, rs);
  if (send) io.out = SendSlot(a, ch, p.sendPeer, proto, ss);
  if (p.flags & kSrcIn) io.src = static_cast<const char*>(sp.send) + (p.srcOff + lo) * unitSize;
  if (p.flags & kSrcOut) io.src = static_cast<const char*>(sp.recv) + (p.srcOff + lo) * unitSize;
  if (p.flags & kDst) io.dst = static_cast<char*>(sp.recv) + (p.dstOff + lo) * unitSize;
  io.pre = (p.flags & kSrcIn) != 0;
  io.post = (p.flags & kPostOp) != 0;
  const int64_t n = m * unitSize / int64_t(sizeof(typename F::Elem));
  bool ok = true;
  if (n > 0) {
    ok = RunPieceData(fn, io, n, proto, LLFlag(rs), LLFlag(ss), a, deadline, ch,
                      recv ? p.recvPeer : p.sendPeer);
  }
  if (!ok) sh->fail = 1;
  __syncthreads();
  if (sh->fail) return false;
  if (threadIdx.x == 0) {
    if (send) {
      if (proto != kProtoLL) Fence(a);
      StoreVolatile64(&SendConn(a, ch, p.sendPeer)->tail, ss + 1);
      StoreVolatile64(SendTailMine(a, ch, p.sendPeer), ss + 1);
      sh->cStep[j] = ss + 1;
    }
    if (recv) {
      StoreVolatile64(&RecvConn(a, ch, p.recvPeer)->head, rs + 1);
      StoreVolatile64(HeadAtSender(a, ch, p.recvPeer), rs + 1);
      sh->cStep[i] = rs + 1;
    }
  }
  return true;
}

// ---- Direct (ours): every rank reads its peers' buffers in place ----
//
// For ranks that can address each other's memory (ranks of one device; devices with peer
// access). Each rank publishes its buffers for the element in the spare words of its own (self)
// connection header of the channel (pad0 = {sequence published, send, recv, op argument},
// pad1 = {done, sequence}; a send to oneself may use that connection's FIFO, never these words),
// waits until every peer published the same sequence, moves the data, posts done and waits for
// every peer's done (so no rank's buffers are reused while a peer still reads or writes them).
// The sequence is kept across launches, like the FIFO counters.
constexpr int kMaxDirectRanks = 64;
struct DirectShared {
  const char* src[kMaxDirectRanks];
  char* dst[kMaxDirectRanks];
  uint64_t arg[kMaxDirectRanks];
  int64_t n;  // elements (reduce) or bytes (copy) per source
  int nsrc, ndst;
  int copyPairs;  // 1: copy src[k] -> dst[k] for every k (no reduction)
};

__device__ inline ConnHeader* SelfConn(const KernelArgs& a, int ch, int k) {
  return reinterpret_cast<ConnHeader*>(a.regions[k] + RegionLayout::HeaderOffset(a.geo, ch, k));
}

// Reduces ds.nsrc sources (source k through PreOp with its owner's argument) into every one of
// ds.ndst destinations (through PostOp); 16-byte packs when every pointer allows.
template <typename F>
__device__ void DirectReduceLoop(const F& fn, const DirectShared& ds) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  using Acc = typename F::Acc;
  constexpr int kEpp = 16 / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  uintptr_t mis = 0;
  for (int k = 0; k < ds.nsrc; ++k) mis |= uintptr_t(ds.src[k]);
  for (int j = 0; j < ds.ndst; ++j) mis |= uintptr_t(ds.dst[j]);
  const int64_t n = ds.n;
  const int64_t nPacks = (mis & 15) == 0 ? n / kEpp : 0;
  for (int64_t i = tid; i < nPacks; i += nt) {
    Acc acc[kEpp];
    for (int k = 0; k < ds.nsrc; ++k) {
      Pack16<T> v;
      v.v = LoadCG(reinterpret_cast<const uint4*>(ds.src[k]) + i);
      const F fk(ds.arg[k]);
#pragma unroll
      for (int e = 0; e < kEpp; ++e) {
        Acc x = Tr::Load(v.e[e]);
        if (F::kHasPreOp) x = fk.PreOp(x);
        acc[e] = k == 0 ? x : fn.Reduce(acc[e], x);
      }
    }
    Pack16<T> r;
#pragma unroll
    for (int e = 0; e < kEpp; ++e) r.e[e] = Tr::Store(F::kHasPostOp ? fn.PostOp(acc[e]) : acc[e]);
    for (int j = 0; j < ds.ndst; ++j) reinterpret_cast<uint4*>(ds.dst[j])[i] = r.v;
  }
  for (int64_t i = nPacks * kEpp + tid; i < n; i += nt) {
    Acc acc = Acc();
    for (int k = 0; k < ds.nsrc; ++k) {
      const F fk(ds.arg[k]);
      Acc x = Tr::Load(reinterpret_cast<const T*>(ds.src[k])[i]);
      if (F::kHasPreOp) x = fk.PreOp(x);
      acc = k == 0 ? x : fn.Reduce(acc, x);
    }
    const T r = Tr::Store(F::kHasPostOp ? fn.PostOp(acc) : acc);
    for (int j = 0; j < ds.ndst; ++j) reinterpret_cast<T*>(ds.dst[j])[i] = r;
  }
}

template <typename F>
__device__ __noinline__ bool RunDirectElem(const KernelArgs& a, uint64_t deadline, int ch,
                                           const WorkElemColl& e, const DevTask& t,
                                           BlockShared* sh) {
  __shared__ DirectShared ds;
  const int n = a.nRanks, r = a.rank;
  const int64_t us = t.unitSize;
  const int64_t wo = int64_t(e.workOffset), wc = int64_t(e.workCount);
  const int64_t count = int64_t(e.count);
  if (threadIdx.x == 0) {
    const SlotPtrs sp = GetSlot(a, e.slot);
    ConnHeader* me = SelfConn(a, ch, r);
    const uint64_t seq = LoadVolatile64(&me->pad1[1]) + 1;
    StoreVolatile64(&me->pad0[1], uint64_t(uintptr_t(sp.send)));
    StoreVolatile64(&me->pad0[2], uint64_t(uintptr_t(sp.recv)));
    StoreVolatile64(&me->pad0[3], t.opArg);
    Fence(a);
    StoreVolatile64(&me->pad0[0], seq);
    bool ok = n <= kMaxDirectRanks;
    if (!ok) Report(a, 2, ch, r, true, seq);
    for (int k = 0; k < n && ok; ++k) {
      ConnHeader* pk = SelfConn(a, ch, k);
      uint64_t seen;
      ok = WaitAtLeast(&pk->pad0[0], seq, a, deadline, ch, k, true, &seen);
      if (!ok) break;
      ds.src[k] = reinterpret_cast<const char*>(uintptr_t(LoadVolatile64(&pk->pad0[1])));
      ds.dst[k] = reinterpret_cast<char*>(uintptr_t(LoadVolatile64(&pk->pad0[2])));
      ds.arg[k] = LoadVolatile64(&pk->pad0[3]);
    }
    Fence(a);  // acquire: the peers' buffers are read after their publishes
    if (ok) {
      // This rank's share of [0, wc): near-equal sub-slices aligned to 64 bytes.
      const int64_t align = us >= 64 ? 1 : 64 / us;
      const int64_t per = ProgDivUp(ProgDivUp(wc, n), align) * align;
      const int64_t lo = ProgMin(wc, per * r), hi = ProgMin(wc, per * (r + 1));
      ds.copyPairs = 0;
      ds.nsrc = n;
      switch (Coll(t.coll)) {
        case Coll::kAllReduce:
        case Coll::kReduce:
          ds.n = hi - lo;
          for (int k = 0; k < n; ++k) {
            ds.src[k] += (wo + lo) * us;
            ds.dst[k] += (wo + lo) * us;
          }
          if (Coll(t.coll) == Coll::kReduce) {
            ds.dst[0] = ds.dst[int(e.root)];
            ds.ndst = 1;
          } else {
            ds.ndst = n;
          }
          break;
        case Coll::kReduceScatter: {
          ds.n = wc;
          char* mine = ds.dst[r] + wo * us;
          for (int k = 0; k < n; ++k) ds.src[k] += (int64_t(r) * count + wo) * us;
          ds.dst[0] = mine;
          ds.ndst = 1;
          break;
        }
        case Coll::kAllGather: {
          ds.n = wc * us;
          ds.copyPairs = 1;
          char* mine = ds.dst[r];
          for (int k = 0; k < n; ++k) {
            ds.src[k] += wo * us;
            ds.dst[k] = mine + (int64_t(k) * count + wo) * us;
          }
          break;
        }
        case Coll::kBroadcast: {
          ds.n = wc * us;
          ds.copyPairs = 1;
          ds.src[0] = ds.src[int(e.root)] + wo * us;
          ds.dst[0] = ds.dst[r] + wo * us;
          ds.nsrc = 1;
          break;
        }
        default:
          ds.n = 0;
          ds.nsrc = 0;
          ds.ndst = 0;
          break;
      }
    }
    sh->rs = seq;
    sh->ok = ok ? 1 : 0;
  }
  __syncthreads();
  if (!sh->ok) return false;
  if (ds.copyPairs) {
    const FuncSum<uint8_t> copyFn(0);
    for (int k = 0; k < ds.nsrc; ++k) {
      if (ds.src[k] == ds.dst[k] || ds.n == 0) continue;
      PieceIo io;
      io.src = ds.src[k];
      io.dst = ds.dst[k];
      SimpleLoop<FuncSum<uint8_t>, false, true>(copyFn, io, ds.n);
    }
  } else if (ds.n > 0) {
    const F fn(t.opArg);
    DirectReduceLoop(fn, ds);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t seq = sh->rs;
    ConnHeader* me = SelfConn(a, ch, r);
    Fence(a);
    StoreVolatile64(&me->pad1[0], seq);
    bool ok = true;
    for (int k = 0; k < n && ok; ++k) {
      uint64_t seen;
      ok = WaitAtLeast(&SelfConn(a, ch, k)->pad1[0], seq, a, deadline, ch, k, true, &seen);
    }
    Fence(a);  // acquire: this rank's output is complete once every peer posted done
    StoreVolatile64(&me->pad1[1], seq);
    sh->ok = ok ? 1 : 0;
  }
  __syncthreads();
  return sh->ok != 0;
}

// One function per (type, op), not inlined into the kernel: keeps the device compiler's work
// linear in the number of instantiations.
template <typename F>
__device__ __noinline__ bool RunCollElem(const KernelArgs& a, uint64_t deadline, int ch,
                                         const WorkElemColl& e, const DevTask& t, BlockShared* sh) {
  const Pattern pattern = Pattern(t.pattern);
  if (pattern == Pattern::kDirect) return RunDirectElem<F>(a, deadline, ch, e, t, sh);
  const F fn(t.opArg);
  const int64_t nOps = CollOpCount(pattern, e, a.nRanks);
  const SlotPtrs sp = GetSlot(a, e.slot);
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

// A send and a receive of one p2p work, interleaved; a send to and a receive from this rank in the
// same work are a copy.
__device__ __noinline__ bool RunP2pWork(const KernelArgs& a, uint64_t deadline, int ch,
                                        const Work& w, BlockShared* sh) {
  const FuncSum<uint8_t> fn(0);
  const WorkElemP2p* el[2] = {nullptr, nullptr};
  int nEl = 0;
  for (int k = 0; k < kMaxWorkElementsP2p; ++k) {
    const WorkElemP2p& p = w.p2pElems[k];
    if (p.p2pType == kWorkP2pTypeSend || p.p2pType == kWorkP2pTypeRecv) el[nEl++] = &p;
  }
  if (nEl == 2 && el[0]->peer == a.rank && el[1]->peer == a.rank) {
    const WorkElemP2p& s = el[0]->p2pType == kWorkP2pTypeSend ? *el[0] : *el[1];
    const WorkElemP2p& r = el[0]->p2pType == kWorkP2pTypeSend ? *el[1] : *el[0];
    const int64_t bytes = int64_t((uint64_t(s.countHi) << 32) | s.countLo);
    const char* from = static_cast<const char*>(GetSlot(a, s.slot).send) +
                       int64_t((uint64_t(s.offsetHi) << 32) | s.offsetLo);
    char* to = static_cast<char*>(GetSlot(a, r.slot).recv) +
               int64_t((uint64_t(r.offsetHi) << 32) | r.offsetLo);
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
  for (int k = 0; k < nEl; ++k) nOps[k] = P2pOpCount(*el[k]);
  int idle = 0;
  while (true) {
    bool allDone = true;
    bool progressed = false;
    for (int k = 0; k < nEl; ++k) {
      if (op[k] >= nOps[k]) continue;
      allDone = false;
      const WorkElemP2p& e = *el[k];
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
      if (!DoPiece(fn, a, deadline, ch, proto, p, lo, m, 1, GetSlot(a, e.slot), sh)) return false;
      __syncthreads();
      progressed = true;
      if (++piece[k] == nPieces) {
        piece[k] = 0;
        ++op[k];
      }
    }
    if (allDone) break;
    if (!progressed && ++idle == 512) {
      idle = 0;
      if (threadIdx.x == 0) {
        const WorkElemP2p& e = *el[0];
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
  __shared__ Work work;
  __shared__ BlockShared sh;
  const BlockInfo bi = a.blocks[blockIdx.x];
  const uint64_t deadline = NowNs() + a.timeoutNs;
  if (threadIdx.x == 0) {
    sh.nConn = 0;
    sh.victim = 0;
  }
  int wi = bi.firstWork;
  while (true) {
    const uint4* from = reinterpret_cast<const uint4*>(a.works + wi);
    uint4* to = reinterpret_cast<uint4*>(&work);
    for (int i = threadIdx.x; i < int(sizeof(Work) / 16); i += blockDim.x) to[i] = from[i];
    __syncthreads();
    bool ok = true;
    if (work.header.type == kWorkTypeColl) {
      const WorkElemColl& e = work.elems[0];
      if (e.isUsed) {
        const DevTask& t = a.tasks[e.slot];
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
