// Narrow floating-point element types shared by host code (the CPU executor) and device code
// (the HIP kernels): float16, bfloat16 and the two fp8 formats, as 8/16-bit storage structs with
// conversions to and from float that round to nearest even (bit-compatible with ml_dtypes, which
// is what XLA's CPU backend uses).
//
// Plain C++17 with fixed-width integers only: no standard-library types, and no intrinsics outside
// the device branch of RoundToHalf, so the same code compiles under g++/clang, hipcc and nvcc.
// JR_HOST_DEVICE marks functions for both sides.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>  // __float2half_rn / __half2float (RoundToHalf in device code)
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define JR_HOST_DEVICE __host__ __device__
#else
#define JR_HOST_DEVICE
#endif

#define JR_INLINE JR_HOST_DEVICE inline

namespace jax_rccl {

// Storage types: the bits only. Arithmetic happens in float (see reduce_functors.h).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
struct Fp8E4M3 {  // float8_e4m3fn: bias 7, no infinities, NaN = S.1111.111, max 448
  uint8_t bits;
};
struct Fp8E5M2 {  // float8_e5m2: bias 15, IEEE-like infinities and NaNs, max 57344
  uint8_t bits;
};

// The bytes of `from` read as a To through a union: all of them when the two are of one size,
// the low ones (little-endian) when To is smaller.
template <typename To, typename From>
JR_INLINE To UnionCast(From from) {
  union {
    From from;
    To to;
  } v;
  v.from = from;
  return v.to;
}

JR_INLINE uint32_t FloatAsBits(float f) {
  return UnionCast<uint32_t>(f);
}

JR_INLINE float BitsAsFloat(uint32_t u) {
  return UnionCast<float>(u);
}

// ---- float16 ----
// Written with selects only, as the fp8 conversions below (see there).

JR_INLINE float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  const uint32_t normal = ((exp + 112u) << 23) | (mant << 13);  // rebias 15 -> 127
  const uint32_t special = 0x7f800000u | (mant << 13);          // inf / NaN (payload kept)
  // Zero or subnormal: mant * 2^-24, exact in float.
  const uint32_t sub = FloatAsBits(float(mant) * 5.9604644775390625e-08f);
  const uint32_t r = exp == 0x1fu ? special : (exp != 0 ? normal : sub);
  return BitsAsFloat(sign | r);
}

JR_INLINE uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatAsBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  // Below 2^-14 the result is subnormal or zero: a float addition with 0.5 rounds the bits into
  // place (0.5 has the exponent that lines the half's 2^-24 unit up with the float's last bit).
  const uint32_t sub = FloatAsBits(BitsAsFloat(ax) + 0.5f) - 0x3f000000u;
  // Normal: rebias 127 -> 15 and round to nearest even (wraps harmlessly where not selected).
  const uint32_t normal = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;
  uint32_t r = ax < 0x38800000u ? sub : normal;
  r = ax >= 0x47800000u ? 0x7c00u : r;  // from 65536 up (and infinity): infinity
  r = ax > 0x7f800000u ? 0x7e00u : r;   // NaN: the quiet NaN
  return uint16_t(sign | r);
}

// `f` rounded to the nearest float16 (ties to even), as a float:
// HalfBitsToFloat(FloatToHalfBits(f)) for every float (checked over all 2^32). Host code uses
// selects only, so that loops vectorize; device code uses the GPU's own conversion instructions
// (round to nearest even, subnormals kept), with a NaN made the quiet NaN of its sign as on the
// host (the instructions give a canonical NaN without the sign).
JR_INLINE float RoundToHalf(float f) {
#if defined(__CUDA_ARCH__)
  const float r = __half2float(__float2half_rn(f));
  return f != f ? BitsAsFloat((FloatAsBits(f) & 0x80000000u) | 0x7fc00000u) : r;
#elif defined(__HIP_DEVICE_COMPILE__)
  const float r = float(static_cast<_Float16>(f));
  return f != f ? BitsAsFloat((FloatAsBits(f) & 0x80000000u) | 0x7fc00000u) : r;
#else
  const uint32_t x = FloatAsBits(f);
  const uint32_t sign = x & 0x80000000u;
  const uint32_t ax = x & 0x7fffffffu;
  // Normal range: the float's significand rounded to 10 bits, ties to even.
  const uint32_t normal = (ax + 0xfffu + ((ax >> 13) & 1u)) & 0xffffe000u;
  // Below 2^-14: multiples of 2^-24, rounded by a float addition (0.5's unit is 2^-24).
  const float sub = (BitsAsFloat(ax) + 0.5f) - 0.5f;
  uint32_t r = ax < 0x38800000u ? FloatAsBits(sub) : normal;
  r = ax >= 0x477ff000u ? 0x7f800000u : r;  // from 65520 up: infinity
  r = ax > 0x7f800000u ? 0x7fc00000u : r;   // NaN: the quiet NaN, sign kept
  return BitsAsFloat(sign | r);
#endif
}

// ---- bfloat16 ----

JR_INLINE float BFloat16BitsToFloat(uint16_t b) {
  return BitsAsFloat(uint32_t(b) << 16);
}

JR_INLINE uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = FloatAsBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- fp8 ----
// A format with E exponent bits, M mantissa bits and bias B. `kFn` formats (e4m3fn) have no
// infinities: their only NaN is all ones and overflow becomes NaN; others (e5m2) overflow to
// infinity.
// Both conversions are written with selects only (no branches): the kernels inline them in
// unrolled loops, where branches multiply the compilers' work and stop vectorization.

template <int E, int M, int B, bool kFn>
JR_INLINE float Fp8BitsToFloat(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t exp = (c >> M) & ((1u << E) - 1u);
  const uint32_t mant = c & ((1u << M) - 1u);
  const uint32_t expMax = (1u << E) - 1u;
  // Normal: rebias; subnormal (exp 0): mant * 2^(1 - B - M), exact in float.
  const uint32_t normal = ((exp + uint32_t(127 - B)) << 23) | (mant << (23 - M));
  const uint32_t sub = FloatAsBits(float(mant) * BitsAsFloat(uint32_t(127 + 1 - B - M) << 23));
  uint32_t r = exp == 0 ? sub : normal;
  if (kFn) {
    r = (exp == expMax && mant == ((1u << M) - 1u)) ? 0x7fc00000u : r;
  } else {
    r = exp == expMax ? (mant != 0 ? 0x7fc00000u : 0x7f800000u) : r;
  }
  return BitsAsFloat(sign | r);
}

template <int E, int M, int B, bool kFn>
JR_INLINE uint8_t FloatToFp8Bits(float f) {
  const uint32_t x = FloatAsBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t ax = x & 0x7fffffffu;
  const uint32_t nanCode = kFn ? 0x7fu : ((1u << (E + M)) - 1u);
  const uint32_t infCode = kFn ? 0x7fu : (((1u << E) - 1u) << M);
  const uint32_t maxCode = kFn ? 0x7eu : infCode - 1u;
  // Subnormal (or zero) in the target: a count of 2^(1-B-M) units rounded to nearest even by a
  // float addition of 2^23 (below 2^-(B-1) the count is far below 2^23).
  const float units = BitsAsFloat(ax) * BitsAsFloat(uint32_t(127 - (1 - B - M)) << 23);
  const uint32_t sub = FloatAsBits(units + 8388608.0f) - 0x4b000000u;
  // Normal: the significand rounded to M bits (ties to even), rebiased; wraps harmlessly where
  // not selected.
  const uint32_t shift = 23 - M;
  const uint32_t rounded = (ax + ((1u << (shift - 1)) - 1u) + ((ax >> shift) & 1u)) >> shift;
  uint32_t code = rounded - (uint32_t(127 - B) << M);
  // At and beyond 2^17 every format here overflows (avoids the rebias wrapping back in range).
  code = ax >= 0x48000000u ? maxCode + 1u : code;
  code = ax < (uint32_t(127 + 1 - B) << 23) ? sub : code;
  code = code > maxCode ? (kFn ? nanCode : infCode) : code;
  code = ax == 0x7f800000u ? infCode : code;
  // NaN: e4m3fn's only code keeps the sign; others give S.11111.11 without the sign.
  return uint8_t(ax > 0x7f800000u ? (kFn ? (sign | nanCode) : nanCode) : (sign | code));
}

JR_INLINE float Fp8E4M3BitsToFloat(uint8_t c) {
  return Fp8BitsToFloat<4, 3, 7, true>(c);
}
JR_INLINE uint8_t FloatToFp8E4M3Bits(float f) {
  return FloatToFp8Bits<4, 3, 7, true>(f);
}
JR_INLINE float Fp8E5M2BitsToFloat(uint8_t c) {
  return Fp8BitsToFloat<5, 2, 15, false>(c);
}
JR_INLINE uint8_t FloatToFp8E5M2Bits(float f) {
  return FloatToFp8Bits<5, 2, 15, false>(f);
}

// The conversions as overloads, for templates over the element type.
JR_INLINE float ToFloat(Half h) {
  return HalfBitsToFloat(h.bits);
}
JR_INLINE float ToFloat(BFloat16 b) {
  return BFloat16BitsToFloat(b.bits);
}
JR_INLINE float ToFloat(Fp8E4M3 c) {
  return Fp8E4M3BitsToFloat(c.bits);
}
JR_INLINE float ToFloat(Fp8E5M2 c) {
  return Fp8E5M2BitsToFloat(c.bits);
}

template <typename T>
JR_INLINE T FromFloat(float f);
template <>
JR_INLINE Half FromFloat<Half>(float f) {
  return Half{FloatToHalfBits(f)};
}
template <>
JR_INLINE BFloat16 FromFloat<BFloat16>(float f) {
  return BFloat16{FloatToBFloat16Bits(f)};
}
template <>
JR_INLINE Fp8E4M3 FromFloat<Fp8E4M3>(float f) {
  return Fp8E4M3{FloatToFp8E4M3Bits(f)};
}
template <>
JR_INLINE Fp8E5M2 FromFloat<Fp8E5M2>(float f) {
  return Fp8E5M2{FloatToFp8E5M2Bits(f)};
}

}  // namespace jax_rccl
