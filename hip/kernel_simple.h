// The Simple protocol's data path of one piece: 16-byte packs through a slot, reduced or copied
// (hip/kernel_piece.h). Device code only.
#pragma once

#include <stdint.h>

#include "hip/kernel_addr.h"

namespace jax_rccl {
namespace gpu {
namespace {

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

// A loop over nPacks packs, kU at a time per thread: `group(base, Bounded<false>())` for each of
// this thread's whole groups (pack indices base, base + nt, ..., all below nPacks), then
// `group(base, Bounded<true>())` once for the part group left, if any.
template <bool kB>
struct Bounded {
  static constexpr bool value = kB;
};
template <int kU, typename G>
__device__ __forceinline__ void ForEachPackGroup(int64_t nPacks, const G& group) {
  const int nt = blockDim.x;
  const int64_t fullEnd = nPacks - int64_t(kU - 1) * nt;
  int64_t base = threadIdx.x;
  for (; base < fullEnd; base += int64_t(kU) * nt) group(base, Bounded<false>());
  if (base < nPacks) group(base, Bounded<true>());
}

// kU packs of this thread, at pack indices i0, i0 + nt, ...; kBounded: only those below nPacks
// (the last group of a loop; zeros stand for the others). The loops' groups are whole, so none of
// their loads or stores is predicated: a bounds test per pack inside the loop left a pack's
// registers holding whatever the last group put there, which ptxas kept live across the loop and,
// in Direct's function, spilled: one local load and store per pack.
// Pack i of p, or zeros where a bounded group runs past nPacks.
template <bool kBounded>
__device__ __forceinline__ uint4 LoadPack(const uint4* p, int64_t i, int64_t nPacks) {
  return !kBounded || i < nPacks ? LoadCG(p + i) : make_uint4(0, 0, 0, 0);
}

template <int kU, bool kBounded, typename F, bool kIn, bool kSrc>
__device__ __forceinline__ void SimplePacks(const F& fn, const PieceIo& io, bool plain, int64_t i0,
                                            int nt, int64_t nPacks) {
  using T = typename F::Elem;
  constexpr int kEpp = 16 / sizeof(T);
  const uint4* in4 = reinterpret_cast<const uint4*>(io.in);
  const uint4* src4 = reinterpret_cast<const uint4*>(io.src);
  uint4* dst4 = reinterpret_cast<uint4*>(io.dst);
  uint4* out4 = reinterpret_cast<uint4*>(io.out);
  Pack16<T> a[kU], b[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t i = i0 + int64_t(u) * nt;
    a[u].v = kIn ? LoadPack<kBounded>(in4, i, nPacks) : make_uint4(0, 0, 0, 0);
    b[u].v = kSrc ? LoadPack<kBounded>(src4, i, nPacks) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t i = i0 + int64_t(u) * nt;
    if (kBounded && i >= nPacks) break;
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

// Simple: 16-byte packs (when every pointer is 16-byte aligned), kU packs in flight per thread
// (kUnroll; Direct's copies take kDirectCopyUnroll), then the remaining elements one by one.
// SimpleLoop is its call (one function per instance); Direct's copies inline the body instead:
// sharing the call with the FIFO programs, ptxas saved more registers around its loop (sm_90: 96
// bytes of spills instead of 32) and Direct's all_gather (then pairwise copies, as broadcast's
// still are) fell from 41-47% to 27-30% of the HBM floor on one H200.
template <typename F, bool kIn, bool kSrc, int kU = kUnroll>
__device__ __forceinline__ void SimpleLoopBody(const F& fn, const PieceIo& io, int64_t n) {
  using T = typename F::Elem;
  constexpr int kEpp = 16 / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  const uintptr_t mis =
      uintptr_t(io.in) | uintptr_t(io.src) | uintptr_t(io.dst) | uintptr_t(io.out);
  const int64_t nPacks = (mis & 15) == 0 ? n / kEpp : 0;
  const bool plain =
      !(kIn && kSrc) && !(F::kHasPreOp && io.pre && kSrc) && !(F::kHasPostOp && io.post);
  ForEachPackGroup<kU>(nPacks, [&](int64_t base, auto bounded) {
    SimplePacks<kU, decltype(bounded)::value, F, kIn, kSrc>(fn, io, plain, base, nt, nPacks);
  });
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

template <typename F, bool kIn, bool kSrc>
__device__ __noinline__ void SimpleLoop(const F& fn, const PieceIo& io, int64_t n) {
  SimpleLoopBody<F, kIn, kSrc>(fn, io, n);
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
