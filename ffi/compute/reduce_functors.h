// The reduction functors shared by the CPU executor and the HIP kernels: Sum, Prod, MinMax,
// PreMulSum and SumPostDiv over every element type the planner knows (DataType).
//
// A functor works on an accumulator type (`Acc`: float for the narrow floating types, the element
// type otherwise) in four parts, so that loops templated on (type, functor) vectorize:
//   Load(T) -> Acc, PreOp(Acc) (applied to a rank's own input once, when it first enters the
//   reduction), Reduce(Acc, Acc), PostOp(Acc) (applied to the final value), Store(Acc) -> T.
// The semantics follow RCCL's device functors (after RCCL src/device/reduce_kernel.h):
//   - integer Sum/Prod wrap around (computed in unsigned arithmetic);
//   - MinMax takes RCCL's xor mask as its argument: integers compare (a ^ mask) < (b ^ mask) as
//     unsigned (the sign bit in the mask orders signed values, all bits turn min into max);
//     floats take the mask's lowest bit as "max" (fmin/fmax semantics: a NaN loses);
//   - PreMulSum multiplies each input by a scalar given as the element type's bits (the narrow
//     types round the product to the element type before the sum, as RCCL's half multiply does);
//   - SumPostDiv sums, then divides by an integer (C++ integer division, as RCCL).
// Beyond RCCL, the floating-point results are those of XLA's CPU backend (jax.lax on CPU), so a
// reduction in rank order gives jax.lax's bits:
//   - float16 and the fp8 types add and multiply in float16: XLA reduces float16 in float16 and
//     widens the 8-bit floats to float16 for a reduction, so every step's result is rounded to
//     half (`ElemTraits::Step`); bfloat16 (widened to float32 by XLA) steps in float;
//   - Sum starts from +0, as XLA's accumulator does: the final value gets a +0 (PostOp), so
//     a sum of negative zeros only is +0;
//   - MinMax starts from the identity (-inf for max, +inf for min) and a NaN never wins: when
//     every input is a NaN, the result is that identity (PostOp).
//
// Plain C++17, fixed-width integers only: no standard-library types (see dtypes.h).
#pragma once

#include <stdint.h>

#include "ffi/compute/dtypes.h"

namespace jax_rccl {

// ---- element traits ----

// `Step` rounds the result of one arithmetic step (an add or a multiply) to the precision the
// type reduces in; Load/Store convert to and from the accumulator.
// Types that accumulate in themselves, with exact steps: the integers, float and double.
template <typename T, bool kIsFloat>
struct SelfTraits {
  using Acc = T;
  static constexpr bool kFloat = kIsFloat;
  static constexpr bool kHalfSteps = false;
  JR_INLINE static Acc Load(T x) { return x; }
  JR_INLINE static T Store(Acc x) { return x; }
  JR_INLINE static Acc Step(Acc x) { return x; }
};
template <typename T>
struct ElemTraits : SelfTraits<T, false> {};
template <>
struct ElemTraits<float> : SelfTraits<float, true> {};
template <>
struct ElemTraits<double> : SelfTraits<double, true> {};

// Narrow floats accumulate in float; `kHalfSteps` rounds every step to float16 (see the top).
template <typename T, bool kHalf>
struct NarrowFloatTraits {
  using Acc = float;
  static constexpr bool kFloat = true;
  static constexpr bool kHalfSteps = kHalf;
  JR_INLINE static Acc Load(T x) { return ToFloat(x); }
  JR_INLINE static T Store(Acc x) { return FromFloat<T>(x); }
  JR_INLINE static Acc Step(Acc x) { return kHalf ? RoundToHalf(x) : x; }
};
template <>
struct ElemTraits<Half> : NarrowFloatTraits<Half, true> {};
template <>
struct ElemTraits<BFloat16> : NarrowFloatTraits<BFloat16, false> {};
template <>
struct ElemTraits<Fp8E4M3> : NarrowFloatTraits<Fp8E4M3, true> {};
template <>
struct ElemTraits<Fp8E5M2> : NarrowFloatTraits<Fp8E5M2, true> {};

// Integer arithmetic that wraps: small types go through uint32_t (no int promotion overflow).
template <typename T>
struct WrapOf {
  using type = uint32_t;
};
template <>
struct WrapOf<int64_t> {
  using type = uint64_t;
};
template <>
struct WrapOf<uint64_t> {
  using type = uint64_t;
};

// Reads a scalar of type T from the low bytes of a 64-bit argument (the element's bits).
template <typename T>
JR_INLINE T ScalarFromBits(uint64_t bits) {
  return UnionCast<T>(bits);
}

template <typename T, bool kFloat = ElemTraits<T>::kFloat>
struct ArithOps;
template <typename T>
struct ArithOps<T, true> {
  using Acc = typename ElemTraits<T>::Acc;
  // The types stepping in float16 keep a NaN accumulator as it is (XLA's order: the first NaN
  // in rank order gives the result's sign, whichever operand order the compiler picks).
  JR_INLINE static Acc Add(Acc a, Acc b) {
    return ElemTraits<T>::kHalfSteps && a != a ? a : ElemTraits<T>::Step(a + b);
  }
  JR_INLINE static Acc Mul(Acc a, Acc b) {
    return ElemTraits<T>::kHalfSteps && a != a ? a : ElemTraits<T>::Step(a * b);
  }
  JR_INLINE static Acc Min(Acc a, Acc b) { return a != a ? b : (b < a ? b : a); }
  JR_INLINE static Acc Max(Acc a, Acc b) { return a != a ? b : (b > a ? b : a); }
  // +inf (as the accumulator type).
  JR_INLINE static Acc Inf() { return Acc(BitsAsFloat(0x7f800000u)); }
};
template <typename T>
struct ArithOps<T, false> {
  using W = typename WrapOf<T>::type;
  JR_INLINE static T Add(T a, T b) { return T(W(a) + W(b)); }
  JR_INLINE static T Mul(T a, T b) { return T(W(a) * W(b)); }
};

// Unsigned type of T's width, for MinMax's xor compare.
template <int kBytes>
struct UnsignedOfSize;
template <>
struct UnsignedOfSize<1> {
  using type = uint8_t;
};
template <>
struct UnsignedOfSize<2> {
  using type = uint16_t;
};
template <>
struct UnsignedOfSize<4> {
  using type = uint32_t;
};
template <>
struct UnsignedOfSize<8> {
  using type = uint64_t;
};

// ---- functors ----

template <typename T>
struct FuncSum {
  using Elem = T;
  using Acc = typename ElemTraits<T>::Acc;
  static constexpr bool kHasPreOp = false;
  // Floats: the sum as from a +0 start (a sum of -0s only is +0; integers need nothing).
  static constexpr bool kHasPostOp = ElemTraits<T>::kFloat;
  JR_HOST_DEVICE explicit FuncSum(uint64_t = 0) {}
  JR_INLINE Acc PreOp(Acc x) const { return x; }
  JR_INLINE Acc Reduce(Acc a, Acc b) const { return ArithOps<T>::Add(a, b); }
  JR_INLINE Acc PostOp(Acc x) const { return kHasPostOp ? x + Acc(0) : x; }
};

template <typename T>
struct FuncProd {
  using Elem = T;
  using Acc = typename ElemTraits<T>::Acc;
  static constexpr bool kHasPreOp = false;
  static constexpr bool kHasPostOp = false;
  JR_HOST_DEVICE explicit FuncProd(uint64_t = 0) {}
  JR_INLINE Acc PreOp(Acc x) const { return x; }
  JR_INLINE Acc Reduce(Acc a, Acc b) const { return ArithOps<T>::Mul(a, b); }
  JR_INLINE Acc PostOp(Acc x) const { return x; }
};

template <typename T, bool kFloat = ElemTraits<T>::kFloat>
struct FuncMinMax;

template <typename T>
struct FuncMinMax<T, false> {
  using Elem = T;
  using Acc = T;
  using U = typename UnsignedOfSize<sizeof(T)>::type;
  static constexpr bool kHasPreOp = false;
  static constexpr bool kHasPostOp = false;
  U mask;
  JR_HOST_DEVICE explicit FuncMinMax(uint64_t arg = 0) : mask(U(arg)) {}
  JR_INLINE Acc PreOp(Acc x) const { return x; }
  JR_INLINE Acc Reduce(Acc a, Acc b) const { return U(U(a) ^ mask) < U(U(b) ^ mask) ? a : b; }
  JR_INLINE Acc PostOp(Acc x) const { return x; }
};

template <typename T>
struct FuncMinMax<T, true> {
  using Elem = T;
  using Acc = typename ElemTraits<T>::Acc;
  static constexpr bool kHasPreOp = false;
  static constexpr bool kHasPostOp = true;
  bool isMax;
  JR_HOST_DEVICE explicit FuncMinMax(uint64_t arg = 0) : isMax((arg & 1) != 0) {}
  JR_INLINE Acc PreOp(Acc x) const { return x; }
  JR_INLINE Acc Reduce(Acc a, Acc b) const {
    return isMax ? ArithOps<T>::Max(a, b) : ArithOps<T>::Min(a, b);
  }
  // A NaN is left only when every input was one: the identity, as from XLA's start value.
  JR_INLINE Acc PostOp(Acc x) const {
    return x != x ? (isMax ? -ArithOps<T>::Inf() : ArithOps<T>::Inf()) : x;
  }
};

template <typename T>
struct FuncPreMulSum {
  using Elem = T;
  using Acc = typename ElemTraits<T>::Acc;
  static constexpr bool kHasPreOp = true;
  static constexpr bool kHasPostOp = false;
  Acc scalar;
  JR_HOST_DEVICE explicit FuncPreMulSum(uint64_t arg = 0)
      : scalar(ElemTraits<T>::Load(ScalarFromBits<T>(arg))) {}
  JR_INLINE Acc PreOp(Acc x) const {
    // The product is rounded to the element type once (a no-op for float, double and integers).
    if constexpr (ElemTraits<T>::kFloat)
      return ElemTraits<T>::Load(ElemTraits<T>::Store(x * scalar));
    return ArithOps<T>::Mul(x, scalar);
  }
  JR_INLINE Acc Reduce(Acc a, Acc b) const { return ArithOps<T>::Add(a, b); }
  JR_INLINE Acc PostOp(Acc x) const { return x; }
};

template <typename T>
struct FuncSumPostDiv {
  using Elem = T;
  using Acc = typename ElemTraits<T>::Acc;
  static constexpr bool kHasPreOp = false;
  static constexpr bool kHasPostOp = true;
  int divisor;
  JR_HOST_DEVICE explicit FuncSumPostDiv(uint64_t arg = 0) : divisor(int(arg)) {}
  JR_INLINE Acc PreOp(Acc x) const { return x; }
  JR_INLINE Acc Reduce(Acc a, Acc b) const { return ArithOps<T>::Add(a, b); }
  // RCCL defines it for integers only (avg of floats is a PreMulSum); floats divide too.
  JR_INLINE Acc PostOp(Acc x) const { return Acc(x / divisor); }
};

}  // namespace jax_rccl
