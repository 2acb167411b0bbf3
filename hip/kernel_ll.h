// The LL protocol's words and lines (8 data bytes and a flag per 16 bytes) and its data path of
// one piece (hip/kernel_piece.h); Direct's one-hop path uses the lines too. Device code only.
#pragma once

#include <stdint.h>

#include "hip/kernel_simple.h"

namespace jax_rccl {
namespace gpu {
namespace {

// ---- LL words and lines (the ring's LL steps and Direct's one-hop path) ----

// The `wb` (<= 8) bytes at p as one word, zero-padded.
__device__ inline uint64_t LoadWord(const char* p, int wb) {
  if (wb == 8 && (uintptr_t(p) & 7) == 0) return LoadCG(reinterpret_cast<const uint64_t*>(p));
  Word8<uint8_t> w;
  w.u = 0;
  for (int i = 0; i < wb; ++i) w.b[i] = static_cast<unsigned char>(p[i]);
  return w.u;
}
// The first `wb` (<= 8) bytes of word v at p.
__device__ inline void StoreWord(char* p, uint64_t v, int wb) {
  if (wb == 8 && (uintptr_t(p) & 7) == 0) {
    *reinterpret_cast<uint64_t*>(p) = v;
    return;
  }
  Word8<uint8_t> w;
  w.u = v;
  for (int i = 0; i < wb; ++i) p[i] = static_cast<char>(w.b[i]);
}

// Bytes of word w (bytes [8w, 8w + 8)) inside a piece of `bytes`: 8, or fewer for the last word.
__device__ inline int WordBytes(int64_t bytes, int64_t w) {
  return int(bytes - 8 * w < 8 ? bytes - 8 * w : 8);
}

// Word v as an LL line: {lo, flags' low half, hi, flags' high half} (LLFlags), stored in one
// access.
__device__ inline uint4 LLLine(uint64_t v, uint64_t flags) {
  uint4 line;
  line.x = uint32_t(v);
  line.y = uint32_t(flags);
  line.z = uint32_t(v >> 32);
  line.w = uint32_t(flags >> 32);
  return line;
}

// Waits for the kN consecutive LL lines at `lines` to carry `flags` (LLFlags), all loaded at once
// (one round trip when they are there; a timeout reports `step`); their words in out[0, kN). A
// first line that carries this step's flag and another call's tag at two checks in a row is a
// peer running another call (kDevMismatch; a single look could catch an access split in two).
template <int kN>
__device__ inline bool PollLines(const uint4* lines, uint64_t flags, const KernelArgs& a,
                                 uint64_t deadline, int ch, int peer, uint64_t step,
                                 uint64_t* out) {
  const uint32_t lo = uint32_t(flags), hi = uint32_t(flags >> 32);
  uint4 l[kN];
  int spins = 0;
  uint32_t other = 0;
  while (true) {
    bool fresh = true;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      l[i] = LoadVolatile(lines + i);
      fresh = fresh && l[i].y == lo && l[i].w == hi;
    }
    if (fresh) break;
    if (++spins == kSpinsPerAbortCheck) {
      spins = 0;
      uint32_t seen;
      if (LLOtherCall(l[0].y, l[0].w, flags, &seen)) {
        if (other == l[0].w) {
          ReportMismatch(a, ch, peer, step, seen, 32);
          return false;
        }
        other = l[0].w;
      } else {
        other = 0;
      }
      if (ShouldStop(a, deadline, ch, peer, true, step)) return false;
    }
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) out[i] = uint64_t(l[i].x) | (uint64_t(l[i].z) << 32);
  return true;
}
// One line: its word in *out.
__device__ inline bool PollLine(const uint4* line, uint64_t flag, const KernelArgs& a,
                                uint64_t deadline, int ch, int peer, uint64_t step, uint64_t* out) {
  return PollLines<1>(line, flag, a, deadline, ch, peer, step, out);
}

// LL: word w of the piece (bytes [8w, 8w + 8)) travels in line w: {lo, flag, hi, flag}.
template <typename F, bool kIn, bool kSrc>
__device__ __noinline__ bool LLLoop(const F& fn, const PieceIo& io, int64_t n, uint64_t inFlag,
                                    uint64_t outFlag, const KernelArgs& a, uint64_t deadline,
                                    int ch, int peer) {
  using T = typename F::Elem;
  constexpr int kEpw = 8 / sizeof(T);
  const int64_t bytes = n * int64_t(sizeof(T));
  const int64_t nWords = (bytes + 7) / 8;
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint4* inL = reinterpret_cast<const uint4*>(io.in);
  uint4* outL = reinterpret_cast<uint4*>(io.out);
  for (int64_t w = tid; w < nWords; w += nt) {
    const int wb = WordBytes(bytes, w);
    Word8<T> s, r, v;
    s.u = kSrc ? LoadWord(io.src + 8 * w, wb) : 0;
    r.u = 0;
    if (kIn && !PollLine(inL + w, inFlag, a, deadline, ch, peer, uint32_t(inFlag) - 1, &r.u)) {
      return false;
    }
#pragma unroll
    for (int k = 0; k < kEpw; ++k) {
      v.e[k] = Combine<F, kIn, kSrc>(fn, r.e[k], s.e[k], io.pre, io.post);
    }
    if (io.dst != nullptr) StoreWord(io.dst + 8 * w, v.u, wb);
    if (outL != nullptr) StoreVolatile(outL + w, LLLine(v.u, outFlag));
  }
  return true;
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
