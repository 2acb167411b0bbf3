// The executor's inner loops (private to ffi/cpu/, included by executor.cc only): element-wise
// reduce/copy loops templated on (element type, reduce functor), chosen once per piece of work
// through a small table, never per element.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ffi/compute/reduce_functors.h"
#include "ffi/planner/types.h"

namespace jax_rccl {
namespace host {

// One piece of a ring/tree/p2p primitive: `in` (a FIFO slot received), `src` (this rank's
// input), `dst` (this rank's output), `out` (a FIFO slot to send). Null pointers are absent.
// The value is Reduce(in, PreOp(src)) when both are present, else whichever is; `post` applies
// the functor's PostOp (the final write); `preSrc` applies PreOp to `src` (a user input, not an
// output being forwarded).
struct PieceArgs {
  const void* in = nullptr;
  const void* src = nullptr;
  void* dst = nullptr;
  void* out = nullptr;
  int64_t n = 0;  // elements
  bool preSrc = true;
  bool post = false;
};
using PieceFn = void (*)(const PieceArgs& a, uint64_t opArg);

// Direct: reduces `nsrc` inputs of `n` elements (input k through the PreOp of opArgs[k], its
// owner's scalar) into `ndst` outputs (through PostOp). Reads every input of a block before
// writing any output, so outputs may alias inputs.
using DirectFn = void (*)(const void* const* srcs, int nsrc, void* const* dsts, int ndst, int64_t n,
                          const uint64_t* opArgs);

struct KernelFns {
  PieceFn piece = nullptr;
  DirectFn direct = nullptr;
};

namespace kernels_detail {

// Copies `bytes` from `from` to `to` unless they are the same buffer.
inline void CopyBytes(void* to, const void* from, size_t bytes) {
  if (to != from && bytes != 0) std::memcpy(to, from, bytes);
}

template <typename F, bool kIn, bool kSrc, bool kPre, bool kPost, bool kTwo>
void PieceLoop(const PieceArgs& a, const F& fn) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  using Acc = typename F::Acc;
  const T* __restrict in = static_cast<const T*>(a.in);
  const T* __restrict src = static_cast<const T*>(a.src);
  T* __restrict o1 = static_cast<T*>(a.dst != nullptr ? a.dst : a.out);
  T* __restrict o2 = static_cast<T*>(a.out);
  const int64_t n = a.n;
  for (int64_t i = 0; i < n; ++i) {
    Acc v;
    if (kIn && kSrc) {
      Acc s = Tr::Load(src[i]);
      if (kPre) s = fn.PreOp(s);
      v = fn.Reduce(Tr::Load(in[i]), s);
    } else if (kIn) {
      v = Tr::Load(in[i]);
    } else {
      v = Tr::Load(src[i]);
      if (kPre) v = fn.PreOp(v);
    }
    if (kPost) v = fn.PostOp(v);
    const T r = Tr::Store(v);
    o1[i] = r;
    if (kTwo) o2[i] = r;
  }
}

template <typename F, bool kIn, bool kSrc, bool kPre, bool kPost>
void PieceOuts(const PieceArgs& a, const F& fn) {
  if (a.dst != nullptr && a.out != nullptr) {
    PieceLoop<F, kIn, kSrc, kPre, kPost, true>(a, fn);
  } else {
    PieceLoop<F, kIn, kSrc, kPre, kPost, false>(a, fn);
  }
}

template <typename F, bool kIn, bool kSrc>
void PiecePrePost(const PieceArgs& a, const F& fn) {
  const bool pre = F::kHasPreOp && kSrc && a.preSrc;
  const bool post = F::kHasPostOp && a.post;
  if constexpr (F::kHasPreOp && kSrc) {
    if (pre) {
      if constexpr (F::kHasPostOp) {
        if (post) return PieceOuts<F, kIn, kSrc, true, true>(a, fn);
      }
      return PieceOuts<F, kIn, kSrc, true, false>(a, fn);
    }
  }
  if constexpr (F::kHasPostOp) {
    if (post) return PieceOuts<F, kIn, kSrc, false, true>(a, fn);
  }
  (void)pre;
  (void)post;
  // No transformation: a copy when only one input.
  if constexpr (!(kIn && kSrc)) {
    using T = typename F::Elem;
    const void* from = kIn ? a.in : a.src;
    const size_t bytes = size_t(a.n) * sizeof(T);
    if (a.dst != nullptr) CopyBytes(a.dst, from, bytes);
    if (a.out != nullptr) CopyBytes(a.out, from, bytes);
    return;
  }
  PieceOuts<F, kIn, kSrc, false, false>(a, fn);
}

template <typename F>
void RunPiece(const PieceArgs& a, uint64_t opArg) {
  const F fn(opArg);
  if (a.n <= 0) return;
  if (a.in != nullptr && a.src != nullptr) return PiecePrePost<F, true, true>(a, fn);
  if (a.in != nullptr) return PiecePrePost<F, true, false>(a, fn);
  if (a.src != nullptr) return PiecePrePost<F, false, true>(a, fn);
}

inline void CopyPiece(const PieceArgs& a, uint64_t) {
  if (a.n <= 0) return;
  const void* from = a.in != nullptr ? a.in : a.src;
  if (a.dst != nullptr) CopyBytes(a.dst, from, size_t(a.n));
  if (a.out != nullptr) CopyBytes(a.out, from, size_t(a.n));
}

// Elements per block of the Direct reduction: the accumulator block stays in L1.
constexpr int64_t kDirectBlockBytes = 8192;
// Outputs at least this large are written with streaming stores (they bypass the caches: no
// read-for-ownership of lines that are about to be overwritten whole).
constexpr int64_t kStreamMinBytes = 1 << 20;

// Copies `bytes` to `to`, with streaming stores where the platform has them.
inline void StreamCopy(void* to, const void* from, size_t bytes) {
#if defined(__SSE2__)
  char* d = static_cast<char*>(to);
  const char* s = static_cast<const char*>(from);
  const size_t head = std::min(bytes, size_t((16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15));
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t body = bytes & ~size_t(15);
  for (size_t i = 0; i < body; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
  std::memcpy(d + body, s + body, bytes - body);
#else
  std::memcpy(to, from, bytes);
#endif
}

inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// One pass over K inputs of a block: v = (first ? in_0 : acc[i]) reduced with the next inputs
// (each through its PreOp), kept in registers so the compiler vectorizes over i. Not final: the
// running value goes back to acc; final: PostOp and the store to `out` in the element type.
template <typename F, int K, bool kFinal, bool kFirst>
JR_INLINE void FusedLoop(typename F::Acc* __restrict acc, typename F::Elem* __restrict out,
                         const typename F::Elem* const* srcs, const F* fns, int64_t m) {
  using Tr = ElemTraits<typename F::Elem>;
  using Acc = typename F::Acc;
  const typename F::Elem* __restrict s[K];
  for (int k = 0; k < K; ++k) s[k] = srcs[k];
  for (int64_t i = 0; i < m; ++i) {
    Acc v;
    if constexpr (kFirst) {
      v = Tr::Load(s[0][i]);
      if constexpr (F::kHasPreOp) v = fns[0].PreOp(v);
    } else {
      v = acc[i];
    }
#pragma GCC unroll 8
    for (int k = kFirst ? 1 : 0; k < K; ++k) {
      Acc x = Tr::Load(s[k][i]);
      if constexpr (F::kHasPreOp) x = fns[k].PreOp(x);
      v = fns[0].Reduce(v, x);
    }
    if constexpr (kFinal) {
      if constexpr (F::kHasPostOp) v = fns[0].PostOp(v);
      out[i] = Tr::Store(v);
    } else {
      acc[i] = v;
    }
  }
}

// One pass over K inputs of a block: v = (first ? in_0 : acc[i]) reduced with the next inputs
// (each through its PreOp), kept in registers so the compiler vectorizes over i. Not final: the
// running value goes back to acc; final: PostOp and the store to `out` in the element type.
template <typename F, int K, bool kFinal>
JR_INLINE void FusedBlock(typename F::Acc* acc, typename F::Elem* out,
                          const typename F::Elem* const* srcs, const F* fns, int64_t m,
                          bool first) {
  if (first) {
    FusedLoop<F, K, kFinal, true>(acc, out, srcs, fns, m);
  } else {
    FusedLoop<F, K, kFinal, false>(acc, out, srcs, fns, m);
  }
}

// FusedBlock of K = k inputs, K from 1 to 8 (8 for any other k): a table of the eight.
template <typename F, bool kFinal, int... Ks>
void FusedGroupOf(std::integer_sequence<int, Ks...>, typename F::Acc* acc, typename F::Elem* out,
                  const typename F::Elem* const* srcs, const F* fns, int k, int64_t m, bool first) {
  using Block = void (*)(typename F::Acc*, typename F::Elem*, const typename F::Elem* const*,
                         const F*, int64_t, bool);
  static constexpr Block kBlocks[] = {&FusedBlock<F, Ks + 1, kFinal>...};
  constexpr int kMax = int(sizeof...(Ks));
  kBlocks[(k >= 1 && k < kMax ? k : kMax) - 1](acc, out, srcs, fns, m, first);
}

template <typename F, bool kFinal>
void FusedGroup(typename F::Acc* acc, typename F::Elem* out, const typename F::Elem* const* srcs,
                const F* fns, int k, int64_t m, bool first) {
  FusedGroupOf<F, kFinal>(std::make_integer_sequence<int, 8>(), acc, out, srcs, fns, k, m, first);
}

// Direct: reduces `nsrc` inputs of `n` elements (input k through the PreOp of opArgs[k], its
// owner's scalar) into `ndst` outputs (through PostOp), block by block, in input order (rank 0's
// value, then rank 1's, ..., as a sequential reduction). Every input element is read before the
// output element at the same offset is written, so outputs may alias inputs at equal offsets.
template <typename F>
void RunDirect(const void* const* srcs, int nsrc, void* const* dsts, int ndst, int64_t n,
               const uint64_t* opArgs) {
  using T = typename F::Elem;
  using Acc = typename F::Acc;
  constexpr int64_t kBlock = kDirectBlockBytes / sizeof(Acc);
  constexpr int kGroup = 8;
  if (ndst == 0 || nsrc == 0) return;
  std::vector<F> fns;
  fns.reserve(nsrc);
  for (int k = 0; k < nsrc; ++k) fns.emplace_back(opArgs[k]);
  const bool stream = ndst > 1 && int64_t(n * sizeof(T)) >= kStreamMinBytes;
  const T* ptrs[kGroup];
  if (nsrc <= kGroup && !stream) {
    // One pass over whole streams (the prefetchers' best case), straight into the first output.
    for (int k = 0; k < nsrc; ++k) ptrs[k] = static_cast<const T*>(srcs[k]);
    T* d0 = static_cast<T*>(dsts[0]);
    FusedGroup<F, true>(nullptr, d0, ptrs, fns.data(), nsrc, n, true);
    for (int k = 1; k < ndst; ++k) std::memcpy(dsts[k], d0, size_t(n) * sizeof(T));
    return;
  }
  alignas(64) Acc acc[kBlock];
  alignas(64) T tmp[kBlock];
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t m = n - off < kBlock ? n - off : kBlock;
    // The final value goes to the first output directly, or to `tmp` when it is streamed out.
    T* first = stream ? tmp : static_cast<T*>(dsts[0]) + off;
    for (int k0 = 0; k0 < nsrc; k0 += kGroup) {
      const int kn = nsrc - k0 < kGroup ? nsrc - k0 : kGroup;
      for (int k = 0; k < kn; ++k) ptrs[k] = static_cast<const T*>(srcs[k0 + k]) + off;
      if (k0 + kn == nsrc) {
        FusedGroup<F, true>(acc, first, ptrs, fns.data() + k0, kn, m, k0 == 0);
      } else {
        FusedGroup<F, false>(acc, first, ptrs, fns.data() + k0, kn, m, k0 == 0);
      }
    }
    const size_t bytes = size_t(m) * sizeof(T);
    for (int k = stream ? 0 : 1; k < ndst; ++k) {
      T* d = static_cast<T*>(dsts[k]) + off;
      if (stream) {
        StreamCopy(d, first, bytes);
      } else {
        std::memcpy(d, first, bytes);
      }
    }
  }
  if (stream) StreamFence();
}

template <typename T>
KernelFns FnsFor(DevRedOp op) {
  switch (op) {
    case DevRedOp::kSum:
      return {&RunPiece<FuncSum<T>>, &RunDirect<FuncSum<T>>};
    case DevRedOp::kProd:
      return {&RunPiece<FuncProd<T>>, &RunDirect<FuncProd<T>>};
    case DevRedOp::kMinMax:
      return {&RunPiece<FuncMinMax<T>>, &RunDirect<FuncMinMax<T>>};
    case DevRedOp::kPreMulSum:
      return {&RunPiece<FuncPreMulSum<T>>, &RunDirect<FuncPreMulSum<T>>};
    case DevRedOp::kSumPostDiv:
      return {&RunPiece<FuncSumPostDiv<T>>, &RunDirect<FuncSumPostDiv<T>>};
  }
  return {};
}

}  // namespace kernels_detail

// The loops for (dtype, op); bool reduces as uint8. Returns null members for an unknown pair.
inline KernelFns GetKernelFns(DataType dtype, DevRedOp op) {
  using namespace kernels_detail;  // NOLINT
  switch (dtype) {
    case DataType::kInt8:
      return FnsFor<int8_t>(op);
    case DataType::kUint8:
    case DataType::kBool:
      return FnsFor<uint8_t>(op);
    case DataType::kInt16:
      return FnsFor<int16_t>(op);
    case DataType::kUint16:
      return FnsFor<uint16_t>(op);
    case DataType::kInt32:
      return FnsFor<int32_t>(op);
    case DataType::kUint32:
      return FnsFor<uint32_t>(op);
    case DataType::kInt64:
      return FnsFor<int64_t>(op);
    case DataType::kUint64:
      return FnsFor<uint64_t>(op);
    case DataType::kFloat16:
      return FnsFor<Half>(op);
    case DataType::kBfloat16:
      return FnsFor<BFloat16>(op);
    case DataType::kFloat32:
      return FnsFor<float>(op);
    case DataType::kFloat64:
      return FnsFor<double>(op);
    case DataType::kFp8E4M3:
      return FnsFor<Fp8E4M3>(op);
    case DataType::kFp8E5M2:
      return FnsFor<Fp8E5M2>(op);
  }
  return {};
}

// Byte copies (all_gather, broadcast, p2p): the piece function of a plain copy.
inline PieceFn CopyPieceFn() {
  return &kernels_detail::CopyPiece;
}

}  // namespace host
}  // namespace jax_rccl
