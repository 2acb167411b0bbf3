// Direct, the collective kernels' algorithm for ranks that address each other's memory (see
// hip/kernel_impl.h). Device code only.
#pragma once

#include "hip/kernel_piece.h"

namespace jax_rccl {
namespace gpu {
namespace {

// ---- Direct (ours): ranks read and write each other's buffers in place ----
//
// For ranks that can address each other's memory (ranks of one device; devices with peer
// access). An element runs between two barriers, each one store to every peer and one poll per
// peer of this rank's own memory, all peers at once (thread k of the block publishes to peer k,
// thread kDirectWaiter + k waits for peer k):
//   1. rank r writes its buffers (send, recv, op argument) as three LL lines flagged with the
//      element's sequence into its box in every peer k's region, and waits until every peer's box
//      in its own region carries the same flag (every input is ready, every output may be
//      written). A line says itself whether it is fresh, so no fence stands between the words and
//      the flag, and the waiting threads, having stored nothing, pay nothing for their fence;
//   2. the block moves the data: reads the peers' inputs in place, writes the outputs (all_gather
//      instead pushes: reads this rank's input once and writes it into every rank's output);
//   3. rank r posts done (the sequence) into its box in every peer's region and waits for every
//      peer's done in its own (no rank's buffers are reused while a peer still reads or writes
//      them).
// Rank r's box in rank k's region, for a channel, is the spare words (indices below kSendPad) of
// the connection header (channel, from r) there; a send to oneself may use the self connection's
// FIFO, never these words. Only rank r writes its boxes, and every poll reads local memory, so
// across devices only stores cross the link. The sequence is kept in rank r's own self box, across
// launches like the FIFO counters.
constexpr int kBoxLines = 1;  // pad0[1..6]: three LL lines (send buffer, recv buffer, op argument)
constexpr int kBoxDone = 1;   // pad1: the sequence done
constexpr int kBoxCount = 2;  // pad1, in the owner's self box only: its last sequence
static_assert(kBoxLines + 6 <= kSendPad && kBoxCount < kSendPad,
              "Direct's words lie below kSendPad");
static_assert((8 + 8 * kBoxLines) % 16 == 0, "a box's lines are 16-byte aligned in its header");
// The first thread of the warps that wait for the peers (those below publish to them): a thread
// that stored nothing makes its acquire fence without waiting for stores.
constexpr int kDirectWaiter = 64;
static_assert(kDirectWaiter >= kMaxDirectRanks &&
                  kDirectWaiter + kMaxDirectRanks <= kMinLaunchThreads,
              "Direct's publishing and waiting threads are disjoint and in every block");

struct DirectShared {
  const char* src[kMaxDirectRanks];
  char* dst[kMaxDirectRanks];
  uint64_t arg[kMaxDirectRanks];
};

// The box of rank `from` in rank `at`'s region for channel `ch`.
__device__ inline ConnHeader* DirectBox(const KernelArgs& a, int ch, int at, int from) {
  return reinterpret_cast<ConnHeader*>(a.regions[at] + RegionLayout::HeaderOffset(a.geo, ch, from));
}

// What the element moves, the same on every thread: `n` elements (reduce) or bytes (copy) per
// source; sources [s0, s0 + nsrc) and destinations [d0, d0 + ndst) of DirectShared; copyPairs:
// copy src[k] -> dst[k] for each source k instead of reducing; push: copy the one source into
// every destination (a destination that is the source itself is left alone); `lo`: this rank's
// first unit of the element's [0, workCount) (all_reduce, reduce).
struct DirectShape {
  int64_t n = 0, lo = 0;
  int s0 = 0, nsrc = 0, d0 = 0, ndst = 0;
  bool copyPairs = false;
  bool push = false;
};

__device__ inline DirectShape DirectShapeOf(const WorkElemColl& e, const DevTask& t, int r, int n) {
  const int64_t us = t.unitSize, wc = int64_t(e.workCount);
  DirectShape s;
  switch (Coll(t.coll)) {
    case Coll::kAllReduce:
    case Coll::kReduce: {
      // This rank's share of [0, wc): near-equal sub-slices aligned to 64 bytes.
      const int64_t align = us >= 64 ? 1 : 64 / us;
      const int64_t per = ProgDivUp(ProgDivUp(wc, n), align) * align;
      s.lo = ProgMin(wc, per * r);
      s.n = ProgMin(wc, per * (r + 1)) - s.lo;
      s.nsrc = n;
      s.d0 = Coll(t.coll) == Coll::kReduce ? int(e.root) : 0;
      s.ndst = Coll(t.coll) == Coll::kReduce ? 1 : n;
      break;
    }
    case Coll::kReduceScatter:
      s.n = wc;
      s.nsrc = n;
      s.d0 = r;
      s.ndst = 1;
      break;
    case Coll::kAllGather:
      // Pushed: this rank's input is read once and written into every rank's output (pulling,
      // every input was read by every rank: twice the HBM traffic of the floor on one device).
      s.n = wc * us;
      s.push = true;
      s.s0 = r;
      s.nsrc = 1;
      s.ndst = n;
      break;
    case Coll::kBroadcast:
      s.n = wc * us;
      s.copyPairs = true;
      s.s0 = int(e.root);
      s.nsrc = 1;
      break;
    default:
      break;
  }
  return s;
}

// Source and destination k of element `e` for this rank (r), from rank k's buffers.
__device__ inline void DirectPointers(const WorkElemColl& e, const DevTask& t, const DirectShape& s,
                                      int r, const char* sendK, char* recvK, char* recvMine,
                                      const char** src, char** dst) {
  const int64_t us = t.unitSize, wo = int64_t(e.workOffset), count = int64_t(e.count);
  switch (Coll(t.coll)) {
    case Coll::kAllReduce:
    case Coll::kReduce:
      *src = sendK + (wo + s.lo) * us;
      *dst = recvK + (wo + s.lo) * us;
      break;
    case Coll::kReduceScatter:
      *src = sendK + (int64_t(r) * count + wo) * us;
      *dst = recvMine + wo * us;
      break;
    case Coll::kAllGather:  // this rank's slice of rank k's output
      *src = sendK + wo * us;
      *dst = recvK + (int64_t(r) * count + wo) * us;
      break;
    case Coll::kBroadcast:
      *src = sendK + wo * us;
      *dst = recvMine + wo * us;
      break;
    default:
      *src = nullptr;
      *dst = nullptr;
      break;
  }
}

// kU packs of this thread at pack indices i0, i0 + nt, ... (kBounded: those below nPacks; see
// SimplePacks), reduced over the sources into every destination.
template <int kU, bool kBounded, typename F>
__device__ __forceinline__ void DirectReducePacks(const F& fn, const DirectShared& ds,
                                                  const DirectShape& s, int64_t i0, int nt,
                                                  int64_t nPacks) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  using Acc = typename F::Acc;
  constexpr int kEpp = 16 / sizeof(T);
  // Source 0 starts the sums (every group has one: nsrc >= 1); the others reduce into them. Kept
  // out of the loop on purpose: a `k == 0 ? x : Reduce(acc, x)` there had ptxas keep the sums in
  // local memory (32 spill instructions per source in the loop, sm_90).
  Acc acc[kU][kEpp];
  {
    const uint4* src4 = reinterpret_cast<const uint4*>(ds.src[0]);
    Pack16<T> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) v[u].v = LoadPack<kBounded>(src4, i0 + int64_t(u) * nt, nPacks);
    const F f0(ds.arg[0]);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int e = 0; e < kEpp; ++e) {
        acc[u][e] = Tr::Load(v[u].e[e]);
        if (F::kHasPreOp) acc[u][e] = f0.PreOp(acc[u][e]);
      }
    }
  }
  for (int k = 1; k < s.nsrc; ++k) {
    const uint4* src4 = reinterpret_cast<const uint4*>(ds.src[k]);
    Pack16<T> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) v[u].v = LoadPack<kBounded>(src4, i0 + int64_t(u) * nt, nPacks);
    const F fk(ds.arg[k]);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int e = 0; e < kEpp; ++e) {
        Acc x = Tr::Load(v[u].e[e]);
        if (F::kHasPreOp) x = fk.PreOp(x);
        acc[u][e] = fn.Reduce(acc[u][e], x);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    Pack16<T> r;
#pragma unroll
    for (int e = 0; e < kEpp; ++e) {
      r.e[e] = Tr::Store(F::kHasPostOp ? fn.PostOp(acc[u][e]) : acc[u][e]);
    }
    const int64_t i = i0 + int64_t(u) * nt;
    if (kBounded && i >= nPacks) break;
    for (int j = 0; j < s.ndst; ++j) reinterpret_cast<uint4*>(ds.dst[s.d0 + j])[i] = r.v;
  }
}

// Reduces sources [0, nsrc) (source k through PreOp with its owner's argument) into destinations
// [d0, d0 + ndst) (through PostOp); 16-byte packs when every pointer allows.
template <typename F>
__device__ void DirectReduceLoop(const F& fn, const DirectShared& ds, const DirectShape& s) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  using Acc = typename F::Acc;
  constexpr int kEpp = 16 / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  uintptr_t mis = 0;
  for (int k = 0; k < s.nsrc; ++k) mis |= uintptr_t(ds.src[k]);
  for (int j = 0; j < s.ndst; ++j) mis |= uintptr_t(ds.dst[s.d0 + j]);
  const int64_t n = s.n;
  const int64_t nPacks = (mis & 15) == 0 ? n / kEpp : 0;
  // Each source's kUnroll loads of a group in flight together.
  ForEachPackGroup<kUnroll>(nPacks, [&](int64_t base, auto bounded) {
    DirectReducePacks<kUnroll, decltype(bounded)::value>(fn, ds, s, base, nt, nPacks);
  });
  for (int64_t i = nPacks * kEpp + tid; i < n; i += nt) {
    Acc acc = Acc();
    for (int k = 0; k < s.nsrc; ++k) {
      const F fk(ds.arg[k]);
      Acc x = Tr::Load(reinterpret_cast<const T*>(ds.src[k])[i]);
      if (F::kHasPreOp) x = fk.PreOp(x);
      acc = k == 0 ? x : fn.Reduce(acc, x);
    }
    const T r = Tr::Store(F::kHasPostOp ? fn.PostOp(acc) : acc);
    for (int j = 0; j < s.ndst; ++j) reinterpret_cast<T*>(ds.dst[s.d0 + j])[i] = r;
  }
}

// kU packs of this thread at pack indices i0, i0 + nt, ... (kBounded: those below nPacks) of the
// source, stored into every destination but the source itself.
template <int kU, bool kBounded>
__device__ __forceinline__ void DirectPushPacks(const DirectShared& ds, const DirectShape& s,
                                                const uint4* src4, int64_t i0, int nt,
                                                int64_t nPacks) {
  uint4 v[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) v[u] = LoadPack<kBounded>(src4, i0 + int64_t(u) * nt, nPacks);
  for (int j = s.d0; j < s.d0 + s.ndst; ++j) {
    uint4* d4 = reinterpret_cast<uint4*>(ds.dst[j]);
    if (d4 == src4) continue;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t i = i0 + int64_t(u) * nt;
      if (kBounded && i >= nPacks) break;
      d4[i] = v[u];
    }
  }
}

// Copies the s.n bytes of source s0 into destinations [d0, d0 + ndst) (push); 16-byte packs when
// every pointer allows, kDirectCopyUnroll of them in flight per thread.
__device__ void DirectPushLoop(const DirectShared& ds, const DirectShape& s) {
  constexpr int kU = kDirectCopyUnroll;
  const int tid = threadIdx.x, nt = blockDim.x;
  const char* src = ds.src[s.s0];
  uintptr_t mis = uintptr_t(src);
  for (int j = s.d0; j < s.d0 + s.ndst; ++j) mis |= uintptr_t(ds.dst[j]);
  const int64_t nPacks = (mis & 15) == 0 ? s.n / 16 : 0;
  const uint4* src4 = reinterpret_cast<const uint4*>(src);
  ForEachPackGroup<kU>(nPacks, [&](int64_t base, auto bounded) {
    DirectPushPacks<kU, decltype(bounded)::value>(ds, s, src4, base, nt, nPacks);
  });
  for (int64_t i = nPacks * 16 + tid; i < s.n; i += nt) {
    const char c = src[i];
    for (int j = s.d0; j < s.d0 + s.ndst; ++j) {
      if (ds.dst[j] != src) ds.dst[j][i] = c;
    }
  }
}

// ---- Direct's one-hop path for small elements ----
//
// When an element is small, barriers cost more than the data: each rank instead pushes its
// contribution as LL lines into the FIFO of connection (channel, r -> k) of every peer k that needs
// it, and reduces or copies what its peers pushed to it. The lines' flags say the data is there,
// the connections' counters say a slot may be reused (as for a ring's LL step): one hop and no
// barrier. Reductions run over the ranks in rank order on every rank (each contribution through
// PreOp and rounded to T, as the sender sends it), so every rank's result is the same bits. Small:
// the message fits one LL step (half an LL slot), and a rank pushes at most kDirectLLBytes in all
// (the one-hop path's cost grows with the bytes times the peers; on one H200 it beats the barriers
// up to about 8 KiB: benchmarks/gpu_collectives.py, docs/benchmarks-earlier.md).
constexpr int64_t kDirectLLBytes = 8192;
__device__ inline bool DirectFitsLL(const KernelArgs& a, const WorkElemColl& e, const DevTask& t) {
  const int64_t bytes = int64_t(e.workCount) * t.unitSize;
  return bytes <= ProtoLL::DataBytes(a.geo.stepBytes[ProtoLL::kId]) &&
         bytes * (a.nRanks - 1) <= kDirectLLBytes;
}

// A contribution's word as it travels: every element through PreOp, rounded to T.
template <typename F>
__device__ inline uint64_t PreWord(const F& fn, uint64_t u) {
  if (!F::kHasPreOp) return u;
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  Word8<T> v;
  v.u = u;
#pragma unroll
  for (int e = 0; e < int(8 / sizeof(T)); ++e) v.e[e] = Tr::Store(fn.PreOp(Tr::Load(v.e[e])));
  return v.u;
}

// The one-hop path's words of every rank, one per thread (one buffer for every reduction type:
// a static in the template would take its room once per type).
__shared__ uint64_t gDirectWords[kMaxLaunchThreads];

template <typename F>
__device__ __noinline__ bool RunDirectLL(const KernelArgs& a, uint64_t deadline, int ch,
                                         const WorkElemColl& e, const DevTask& t, BlockShared* sh) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  using Acc = typename F::Acc;
  constexpr int kEpw = 8 / sizeof(T);
  __shared__ uint64_t sendStep[kMaxDirectRanks], recvStep[kMaxDirectRanks];
  const int n = a.nRanks, r = a.rank, tid = threadIdx.x, nt = blockDim.x;
  const Coll coll = Coll(t.coll);
  const int root = int(e.root);
  const int64_t us = t.unitSize, wo = int64_t(e.workOffset), count = int64_t(e.count);
  const int64_t bytes = int64_t(e.workCount) * us;
  const int64_t nWords = (bytes + 7) / 8;
  const bool reduction =
      coll == Coll::kAllReduce || coll == Coll::kReduceScatter || coll == Coll::kReduce;
  const bool sends = coll == Coll::kBroadcast ? r == root
                     : coll == Coll::kReduce  ? r != root
                                              : true;
  const bool recvs = coll == Coll::kBroadcast ? r != root
                     : coll == Coll::kReduce  ? r == root
                                              : true;
  auto sendTo = [&](int k) { return k != r && sends && (coll != Coll::kReduce || k == root); };
  auto recvFrom = [&](int k) { return k != r && recvs && (coll != Coll::kBroadcast || k == root); };
  const SlotPtrs sp = GetSlot(a, e.slot);
  const char* send = static_cast<const char*>(sp.send);
  char* recv = static_cast<char*>(sp.recv);
  // This rank's data for rank k (k == r: for itself), and where rank k's data lands.
  auto srcFor = [&](int k) {
    return send + ((coll == Coll::kReduceScatter ? int64_t(k) * count : 0) + wo) * us;
  };
  auto dstFor = [&](int k) {
    return recv + ((coll == Coll::kAllGather ? int64_t(k) * count : 0) + wo) * us;
  };
  // 1. the steps of every connection this element uses; room to send.
  bool ok = true;
  if (tid < n) {
    const int k = tid;
    if (sendTo(k)) {
      // The tail and the head loaded together (one round trip, not two: the head only grows, so
      // an early read can only make this wait).
      const uint64_t ss = LoadVolatile64(SendTailMine(a, ch, k));
      const uint64_t head = LoadVolatile64(SendHeadMine(a, ch, k));
      if (ss + 1 > uint64_t(kSteps) && head < ss + 1 - kSteps) {
        uint64_t seen;
        ok = WaitAtLeast(SendHeadMine(a, ch, k), ss + 1 - kSteps, a, deadline, ch, k, false, &seen);
      }
      sendStep[k] = ss;
    }
    if (recvFrom(k)) recvStep[k] = LoadVolatile64(&RecvConn(a, ch, k)->head);
  }
  if (__syncthreads_or(ok ? 0 : 1)) return false;
  Trace(a, sh, kTraceReady);
  const F fn(TaskOpArg(t, sp));
  // 2. push this rank's words to every peer that needs them.
  if (sends) {
    for (int64_t i = tid; i < n * nWords; i += nt) {
      const int k = int(i / nWords);
      const int64_t w = i - int64_t(k) * nWords;
      if (!sendTo(k)) continue;
      const int wb = WordBytes(bytes, w);
      uint64_t v = LoadWord(srcFor(k) + 8 * w, wb);
      if (reduction) v = PreWord(fn, v);
      StoreVolatile(reinterpret_cast<uint4*>(SendSlot(a, ch, k, ProtoLL::kId, sendStep[k])) + w,
                    LLLine(v, ProtoLL::Flag(sendStep[k])));
    }
  }
  // 3. take the peers' words: reduce them with this rank's own, or copy them into place (after
  // every thread's sends: an in-place output overwrites what they read).
  __syncthreads();
  if (recvs && reduction && int64_t(n) * nWords <= nt) {
    // Every (rank, word) in a thread of its own: the peers' lines polled at once (one round trip;
    // polling one peer after another cost one each), then each word reduced in rank order.
    if (tid < int64_t(n) * nWords) {
      const int k = int(tid / nWords);
      const int64_t w = tid - int64_t(k) * nWords;
      if (k == r) {
        gDirectWords[tid] = PreWord(fn, LoadWord(srcFor(r) + 8 * w, WordBytes(bytes, w)));
      } else {  // a reduction's receiver hears from every other rank
        const uint4* line =
            reinterpret_cast<const uint4*>(RecvSlot(a, ch, k, ProtoLL::kId, recvStep[k])) + w;
        ok = PollLine(line, ProtoLL::Flag(recvStep[k]), a, deadline, ch, k, recvStep[k],
                      &gDirectWords[tid]);
      }
    }
    if (__syncthreads_or(ok ? 0 : 1)) return false;
    if (tid < nWords) {
      const int64_t w = tid;
      Word8<T> v;
      v.u = gDirectWords[w];
      Acc acc[kEpw];
#pragma unroll
      for (int j = 0; j < kEpw; ++j) acc[j] = Tr::Load(v.e[j]);
      for (int k = 1; k < n; ++k) {
        v.u = gDirectWords[int64_t(k) * nWords + w];
#pragma unroll
        for (int j = 0; j < kEpw; ++j) acc[j] = fn.Reduce(acc[j], Tr::Load(v.e[j]));
      }
      Word8<T> o;
#pragma unroll
      for (int j = 0; j < kEpw; ++j) o.e[j] = Tr::Store(F::kHasPostOp ? fn.PostOp(acc[j]) : acc[j]);
      StoreWord(dstFor(r) + 8 * w, o.u, WordBytes(bytes, w));
    }
  } else if (recvs && reduction) {
    for (int64_t w = tid; w < nWords && ok; w += nt) {
      const int wb = WordBytes(bytes, w);
      Acc acc[kEpw];
      bool first = true;
      for (int k = 0; k < n && ok; ++k) {
        Word8<T> v;
        if (k == r) {
          v.u = PreWord(fn, LoadWord(srcFor(r) + 8 * w, wb));
        } else if (recvFrom(k)) {
          const uint4* line =
              reinterpret_cast<const uint4*>(RecvSlot(a, ch, k, ProtoLL::kId, recvStep[k])) + w;
          ok = PollLine(line, ProtoLL::Flag(recvStep[k]), a, deadline, ch, k, recvStep[k], &v.u);
        } else {
          continue;
        }
#pragma unroll
        for (int j = 0; j < kEpw; ++j) {
          const Acc x = Tr::Load(v.e[j]);
          acc[j] = first ? x : fn.Reduce(acc[j], x);
        }
        first = false;
      }
      Word8<T> o;
#pragma unroll
      for (int j = 0; j < kEpw; ++j) o.e[j] = Tr::Store(F::kHasPostOp ? fn.PostOp(acc[j]) : acc[j]);
      if (ok) StoreWord(dstFor(r) + 8 * w, o.u, wb);
    }
  } else if (recvs) {
    for (int64_t i = tid; i < n * nWords && ok; i += nt) {
      const int k = int(i / nWords);
      const int64_t w = i - int64_t(k) * nWords;
      const int wb = WordBytes(bytes, w);
      if (k == r) {
        if (coll == Coll::kAllGather && srcFor(r) != dstFor(r)) {
          StoreWord(dstFor(r) + 8 * w, LoadWord(srcFor(r) + 8 * w, wb), wb);
        }
      } else if (recvFrom(k)) {
        const uint4* line =
            reinterpret_cast<const uint4*>(RecvSlot(a, ch, k, ProtoLL::kId, recvStep[k])) + w;
        uint64_t v;
        ok = PollLine(line, ProtoLL::Flag(recvStep[k]), a, deadline, ch, k, recvStep[k], &v);
        if (ok) StoreWord(dstFor(k) + 8 * w, v, wb);
      }
    }
  }
  if (coll == Coll::kBroadcast && r == root && srcFor(r) != dstFor(r)) {
    for (int64_t w = tid; w < nWords; w += nt) {
      const int wb = WordBytes(bytes, w);
      StoreWord(dstFor(r) + 8 * w, LoadWord(srcFor(r) + 8 * w, wb), wb);
    }
  }
  if (__syncthreads_or(ok ? 0 : 1)) return false;
  Trace(a, sh, kTraceMoved);
  // 4. post the steps; the block's cache of counters (the ring's pieces) is stale now.
  if (tid < n) {
    const int k = tid;
    if (sendTo(k)) {
      StoreVolatile64(&SendConn(a, ch, k)->tail, sendStep[k] + 1);
      StoreVolatile64(SendTailMine(a, ch, k), sendStep[k] + 1);
    }
    if (recvFrom(k)) {
      StoreVolatile64(&RecvConn(a, ch, k)->head, recvStep[k] + 1);
      StoreVolatile64(HeadAtSender(a, ch, k), recvStep[k] + 1);
    }
  }
  if (tid == 0) sh->nConn = 0;
  Trace(a, sh, kTracePosted);
  return true;
}

// The one-hop path of an all_reduce whose (rank, word) pairs fit the block: the latency case, in
// as little code as it needs (RunDirectLL's general loops are ~2,700 instructions on sm_90, which
// a launch of 8 bytes mostly waits to fetch). Thread (k, w) loads this rank's word w before the
// waits, and after them pushes it (through PreOp) to peer k and takes peer k's word w in the same
// thread: no barrier between the sends and the polls. The words are reduced in rank order as on
// the general path, so every rank's result is the same bits.
template <typename F>
__device__ __noinline__ bool RunDirectLLAllReduce(const KernelArgs& a, uint64_t deadline, int ch,
                                                  const WorkElemColl& e, const DevTask& t,
                                                  BlockShared* sh) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  using Acc = typename F::Acc;
  constexpr int kEpw = 8 / sizeof(T);
  __shared__ uint64_t sendStep[kMaxDirectRanks], recvStep[kMaxDirectRanks];
  const int n = a.nRanks, r = a.rank, tid = threadIdx.x;
  const int bytes = int(e.workCount) * int(t.unitSize);  // at most kDirectLLBytes
  const int nWords = (bytes + 7) / 8;
  const int k = tid / nWords, w = tid - k * nWords;  // this thread's (peer, word)
  const bool active = tid < n * nWords;
  const SlotPtrs sp = GetSlot(a, e.slot);
  const int64_t off = int64_t(e.workOffset) * t.unitSize;
  const char* src = static_cast<const char*>(sp.send) + off;
  char* dst = static_cast<char*>(sp.recv) + off;
  // 1. this thread's word, and (threads k < n) the steps of the connections with peer k.
  uint64_t mine = 0;
  if (active) mine = LoadWord(src + 8 * w, WordBytes(bytes, w));
  bool ok = true;
  if (tid < n && tid != r) {
    const uint64_t ss = LoadVolatile64(SendTailMine(a, ch, tid));
    const uint64_t head = LoadVolatile64(SendHeadMine(a, ch, tid));
    if (ss + 1 > uint64_t(kSteps) && head < ss + 1 - kSteps) {
      uint64_t seen;
      ok = WaitAtLeast(SendHeadMine(a, ch, tid), ss + 1 - kSteps, a, deadline, ch, tid, false,
                       &seen);
    }
    sendStep[tid] = ss;
    recvStep[tid] = LoadVolatile64(&RecvConn(a, ch, tid)->head);
  }
  if (__syncthreads_or(ok ? 0 : 1)) return false;
  Trace(a, sh, kTraceReady);
  // 2. push word w to peer k and take peer k's word w.
  const F fn(TaskOpArg(t, sp));
  if (active) {
    const uint64_t v = PreWord(fn, mine);
    if (k == r) {
      gDirectWords[tid] = v;
    } else {
      StoreVolatile(reinterpret_cast<uint4*>(SendSlot(a, ch, k, ProtoLL::kId, sendStep[k])) + w,
                    LLLine(v, ProtoLL::Flag(sendStep[k])));
      const uint4* line =
          reinterpret_cast<const uint4*>(RecvSlot(a, ch, k, ProtoLL::kId, recvStep[k])) + w;
      ok = PollLine(line, ProtoLL::Flag(recvStep[k]), a, deadline, ch, k, recvStep[k],
                    &gDirectWords[tid]);
    }
  }
  if (__syncthreads_or(ok ? 0 : 1)) return false;
  Trace(a, sh, kTraceMoved);
  // 3. reduce word w over the ranks in rank order; post the steps (the lines are sent and the
  // peers' read: the counters need not wait for the output).
  if (tid < nWords) {
    Word8<T> v;
    v.u = gDirectWords[tid];
    Acc acc[kEpw];
#pragma unroll
    for (int j = 0; j < kEpw; ++j) acc[j] = Tr::Load(v.e[j]);
#pragma unroll 1
    for (int q = 1; q < n; ++q) {  // a few ranks: no unrolled copies to fetch
      v.u = gDirectWords[q * nWords + tid];
#pragma unroll
      for (int j = 0; j < kEpw; ++j) acc[j] = fn.Reduce(acc[j], Tr::Load(v.e[j]));
    }
    Word8<T> o;
#pragma unroll
    for (int j = 0; j < kEpw; ++j) o.e[j] = Tr::Store(F::kHasPostOp ? fn.PostOp(acc[j]) : acc[j]);
    StoreWord(dst + 8 * tid, o.u, WordBytes(bytes, tid));
  }
  if (tid < n && tid != r) {
    StoreVolatile64(&SendConn(a, ch, tid)->tail, sendStep[tid] + 1);
    StoreVolatile64(SendTailMine(a, ch, tid), sendStep[tid] + 1);
    StoreVolatile64(&RecvConn(a, ch, tid)->head, recvStep[tid] + 1);
    StoreVolatile64(HeadAtSender(a, ch, tid), recvStep[tid] + 1);
  }
  if (tid == 0) sh->nConn = 0;
  Trace(a, sh, kTracePosted);
  return true;
}

template <typename F>
__device__ __noinline__ bool RunDirectElem(const KernelArgs& a, uint64_t deadline, int ch,
                                           const WorkElemColl& e, const DevTask& t,
                                           BlockShared* sh) {
  __shared__ DirectShared ds;
  const int n = a.nRanks, r = a.rank, k = threadIdx.x;
  Trace(a, sh, kTracePiece);
  if (n > kMaxDirectRanks) {
    if (k == 0) Report(a, kDevTooManyRanks, ch, r, true, 0);
    return false;
  }
  if (DirectFitsLL(a, e, t)) {
    const int64_t nWords = (int64_t(e.workCount) * t.unitSize + 7) / 8;
    if (Coll(t.coll) == Coll::kAllReduce && nWords > 0 && n * nWords <= int64_t(blockDim.x)) {
      return RunDirectLLAllReduce<F>(a, deadline, ch, e, t, sh);
    }
    return RunDirectLL<F>(a, deadline, ch, e, t, sh);
  }
  const SlotPtrs sp = GetSlot(a, e.slot);
  const uint64_t opArg = TaskOpArg(t, sp);
  const DirectShape s = DirectShapeOf(e, t, r, n);
  const int w = k - kDirectWaiter;  // this thread waits for peer w (0 <= w < n)
  const bool publishes = k < n, waits = w >= 0 && w < n;
  uint64_t seq = 0;
  bool ok = true;
  if (publishes || waits) seq = LoadVolatile64(&DirectBox(a, ch, r, r)->pad1[kBoxCount]) + 1;
  if (publishes) {
    // 1. publish this rank's buffers to peer k ...
    uint4* out = reinterpret_cast<uint4*>(&DirectBox(a, ch, k, r)->pad0[kBoxLines]);
    const uint64_t flag = LLFlags(seq);
    StoreVolatile(out, LLLine(uint64_t(uintptr_t(sp.send)), flag));
    StoreVolatile(out + 1, LLLine(uint64_t(uintptr_t(sp.recv)), flag));
    StoreVolatile(out + 2, LLLine(opArg, flag));
  } else if (waits) {
    // ... and wait for peer w's.
    uint64_t words[3];
    ok = PollLines<3>(reinterpret_cast<const uint4*>(&DirectBox(a, ch, r, w)->pad0[kBoxLines]),
                      LLFlags(seq), a, deadline, ch, w, seq - 1, words);
    if (ok) {
      Fence(a);  // acquire: peer w's buffers are read after its publish
      ds.arg[w] = words[2];
      DirectPointers(e, t, s, r, reinterpret_cast<const char*>(uintptr_t(words[0])),
                     reinterpret_cast<char*>(uintptr_t(words[1])), static_cast<char*>(sp.recv),
                     &ds.src[w], &ds.dst[w]);
    }
  }
  if (__syncthreads_or(ok ? 0 : 1)) return false;
  Trace(a, sh, kTraceReady);
  // 2. move the data.
  if (s.push) {
    if (s.n > 0) DirectPushLoop(ds, s);
  } else if (s.copyPairs) {
    const FuncSum<uint8_t> copyFn(0);
    for (int j = s.s0; j < s.s0 + s.nsrc; ++j) {
      if (ds.src[j] == ds.dst[j] || s.n == 0) continue;
      PieceIo io;
      io.src = ds.src[j];
      io.dst = ds.dst[j];
      SimpleLoopBody<FuncSum<uint8_t>, false, true, kDirectCopyUnroll>(copyFn, io, s.n);
    }
  } else if (s.n > 0) {
    const F fn(opArg);
    DirectReduceLoop(fn, ds, s);
  }
  __syncthreads();
  Trace(a, sh, kTraceMoved);
  // 3. post done to peer k; wait for peer w's.
  if (publishes) {
    Fence(a);  // release: this block's reads and writes come before the post
    StoreVolatile64(&DirectBox(a, ch, k, r)->pad1[kBoxDone], seq);
  } else if (waits) {
    uint64_t seen;
    ok = WaitAtLeast(&DirectBox(a, ch, r, w)->pad1[kBoxDone], seq, a, deadline, ch, w, true, &seen);
    Fence(a);  // acquire: this rank's output is complete once every peer posted done
    if (w == 0) StoreVolatile64(&DirectBox(a, ch, r, r)->pad1[kBoxCount], seq);
  }
  const bool failed = __syncthreads_or(ok ? 0 : 1) != 0;
  Trace(a, sh, kTracePosted);
  return !failed;
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
