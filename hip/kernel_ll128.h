// The LL128 protocol's data path of one piece (NVIDIA only; hip/kernel_piece.h). Device code
// only.
#pragma once

#include <stdint.h>

#include "hip/kernel_ll.h"

namespace jax_rccl {
namespace gpu {
namespace {

// ---- LL128 (NVIDIA only: one warp instruction's 16-byte stores to a 128-byte line land together,
// and one warp instruction's loads of it see them together) ----
//
// A line is 16 words: 15 data words, then the step's flag. Eight consecutive lanes of a warp move
// one line, lane k its words 2k and 2k + 1 (lane 7: word 14 and the flag), each with one 16-byte
// access of the same instruction; a receiving group trusts its line once lane 7 sees the flag.
// Data word w of the piece (bytes [8w, 8w + 8)) is word w % 15 of line w / 15.
constexpr int kLL128DataWords = 15;
constexpr int kLL128LineBytes = 128;

// A warp moves kLL128Unroll groups of four lines per iteration: every load of a group is issued
// before any flag is checked, so that many lines per lane are in flight.
constexpr int kLL128Unroll = 4;

template <typename F, bool kIn, bool kSrc>
__device__ __noinline__ bool LL128Loop(const F& fn, const PieceIo& io, int64_t n, uint64_t inFlag,
                                       uint64_t outFlag, const KernelArgs& a, uint64_t deadline,
                                       int ch, int peer) {
  using T = typename F::Elem;
  constexpr int kEpw = 8 / sizeof(T);
  constexpr int kU = kLL128Unroll;
  constexpr int kLinesPerAccess = JAX_RCCL_WARP_SIZE / 8;
  constexpr int kLinesPerWarp = kLinesPerAccess * kU;
  const int64_t bytes = n * int64_t(sizeof(T));
  const int64_t nWords = (bytes + 7) / 8;
  const int64_t nLines = (nWords + kLL128DataWords - 1) / kLL128DataWords;
  const int lane = int(threadIdx.x) % JAX_RCCL_WARP_SIZE, k = lane % 8;
  const int warp = int(threadIdx.x) / JAX_RCCL_WARP_SIZE;
  const int nWarps = int(blockDim.x) / JAX_RCCL_WARP_SIZE;
  const uint4* inL = reinterpret_cast<const uint4*>(io.in);
  uint4* outL = reinterpret_cast<uint4*>(io.out);
  // Warp-uniform trip count: every lane of a warp runs every iteration (the votes need them all).
  for (int64_t base = int64_t(warp) * kLinesPerWarp; base < nLines;
       base += int64_t(nWarps) * kLinesPerWarp) {
    // This lane's line of access u, and whether it exists.
    int64_t line[kU];
    bool live[kU];
    Word8<T> s0[kU], s1[kU], r0[kU], r1[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      line[u] = base + u * kLinesPerAccess + lane / 8;
      live[u] = line[u] < nLines;
      const int64_t w0 = line[u] * kLL128DataWords + 2 * k, w1 = w0 + 1;
      const bool has0 = live[u] && w0 < nWords;
      const bool has1 = live[u] && k != 7 && w1 < nWords;
      s0[u].u = kSrc && has0 ? LoadWord(io.src + 8 * w0, WordBytes(bytes, w0)) : 0;
      s1[u].u = kSrc && has1 ? LoadWord(io.src + 8 * w1, WordBytes(bytes, w1)) : 0;
      r0[u].u = 0;
      r1[u].u = 0;
    }
    if (kIn) {
      int spins = 0;
      while (true) {
        int ok = 1;
        WarpSync();  // each line's eight loads in one instruction
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (live[u]) {
            const uint4 l = LoadVolatile(inL + line[u] * 8 + k);
            r0[u].u = LoWord(l);
            r1[u].u = HiWord(l);
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (k == 7 && live[u] && r1[u].u != inFlag) ok = 0;
        }
        if (WarpAll(WarpShfl(ok, (lane & ~7) | 7))) break;
        if (++spins == kSpinsPerAbortCheck) {
          spins = 0;
          // A line of this step from a peer running another call (its flag word is atomic).
          int other = 0;
          uint32_t seen = 0;
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            if (k == 7 && live[u] && LL128OtherCall(r1[u].u, inFlag, &seen)) other = 1;
          }
          if (!WarpAll(other == 0)) {
            if (other) ReportMismatch(a, ch, peer, uint32_t(inFlag) - 1, seen, 32);
            return false;
          }
          int stop = 0;
          if (lane == 0) stop = ShouldStop(a, deadline, ch, peer, true, inFlag - 1) ? 1 : 0;
          if (WarpShfl(stop, 0) != 0) return false;
        }
      }
    }
    Word8<T> v0[kU], v1[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int e = 0; e < kEpw; ++e) {
        v0[u].e[e] = Combine<F, kIn, kSrc>(fn, r0[u].e[e], s0[u].e[e], io.pre, io.post);
        v1[u].e[e] = Combine<F, kIn, kSrc>(fn, r1[u].e[e], s1[u].e[e], io.pre, io.post);
      }
    }
    if (outL != nullptr) {
      WarpSync();  // each line's eight stores in one instruction
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (live[u]) {
          StoreVolatile(outL + line[u] * 8 + k, TwoWords(v0[u].u, k == 7 ? outFlag : v1[u].u));
        }
      }
    }
    if (io.dst != nullptr) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t w0 = line[u] * kLL128DataWords + 2 * k, w1 = w0 + 1;
        if (live[u] && w0 < nWords) StoreWord(io.dst + 8 * w0, v0[u].u, WordBytes(bytes, w0));
        if (live[u] && k != 7 && w1 < nWords) {
          StoreWord(io.dst + 8 * w1, v1[u].u, WordBytes(bytes, w1));
        }
      }
    }
  }
  return true;
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
