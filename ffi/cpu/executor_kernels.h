// The executor's inner loops (private to ffi/cpu/, included by executor.cc only): element-wise
// reduce/copy loops templated on (element type, reduce functor), chosen once per piece of work
// through a small table, never per element.
#pragma once

#include <cstdint>
#include <cstring>

#include "ffi/planner/types.h"
#include "hip/reduce_functors.h"

namespace jax_rccl {
namespace cpu {

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

template <typename F>
void RunDirect(const void* const* srcs, int nsrc, void* const* dsts, int ndst, int64_t n,
               const uint64_t* opArgs) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  using Acc = typename F::Acc;
  constexpr int64_t kBlock = kDirectBlockBytes / sizeof(Acc);
  const F fn(opArgs[0]);
  alignas(64) Acc acc[kBlock];
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t m = n - off < kBlock ? n - off : kBlock;
    {
      const T* __restrict s = static_cast<const T*>(srcs[0]) + off;
      for (int64_t i = 0; i < m; ++i) {
        Acc v = Tr::Load(s[i]);
        if (F::kHasPreOp) v = fn.PreOp(v);
        acc[i] = v;
      }
    }
    for (int k = 1; k < nsrc; ++k) {
      const T* __restrict s = static_cast<const T*>(srcs[k]) + off;
      const F fk(opArgs[k]);
      for (int64_t i = 0; i < m; ++i) {
        Acc v = Tr::Load(s[i]);
        if (F::kHasPreOp) v = fk.PreOp(v);
        acc[i] = fn.Reduce(acc[i], v);
      }
    }
    if (ndst == 0) continue;
    T* __restrict d0 = static_cast<T*>(dsts[0]) + off;
    for (int64_t i = 0; i < m; ++i) {
      Acc v = acc[i];
      if (F::kHasPostOp) v = fn.PostOp(v);
      d0[i] = Tr::Store(v);
    }
    for (int k = 1; k < ndst; ++k) {
      CopyBytes(static_cast<T*>(dsts[k]) + off, d0, size_t(m) * sizeof(T));
    }
  }
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

}  // namespace cpu
}  // namespace jax_rccl
