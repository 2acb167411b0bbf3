// Direct, the collective kernels' algorithm for ranks that address each other's memory (see
// hip/kernel_impl.h). Device code only.
#pragma once

#include "hip/kernel_piece.h"

namespace jax_rccl {
namespace gpu {
namespace {

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

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
