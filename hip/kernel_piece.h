// The piece machinery of the collective kernels (see hip/kernel_impl.h): where a connection's
// counters and slots lie, the bounded waits, the data paths of one piece (Simple, LL, LL128), the
// protocols as types (ProtoSimple, ProtoLL, ProtoLL128) and DoPiece, which moves one FIFO step of
// a primitive with a given protocol. Device code only.
#pragma once

#include <stdint.h>

#include "ffi/compute/coll_program.h"
#include "ffi/compute/reduce_functors.h"
#include "hip/device_conn.h"
#include "hip/kernel_check.h"
#include "hip/portability.h"

namespace jax_rccl {
namespace gpu {
namespace {

// 16-byte packs in flight per thread in the data loops.
constexpr int kUnroll = 4;
// Direct's copies (the gathers): a copy's pack needs only its own registers, so twice as many
// are in flight; one block of 512 threads per multiprocessor then has 64 KiB of loads in flight,
// what the device's own copy keeps at two blocks each.
constexpr int kDirectCopyUnroll = 8;

__device__ inline SlotPtrs GetSlot(const KernelArgs& a, uint32_t slot) {
  return a.nSlots <= kInlineSlots ? a.inlineSlots[slot] : a.slotTable[slot];
}

// The reduction op's argument of task `t` in this launch: the plan's immediate, or (a PreMulSum
// scalar per device) the element at the slot's scalar pointer, read now (the same launch captured
// in a graph reads each replay's value). Bytewise: the element may be narrower than 8 bytes and
// only its own alignment is known.
__device__ inline uint64_t TaskOpArg(const DevTask& t, const SlotPtrs& sp) {
  if (t.argKind != kArgScalar || sp.scalar == nullptr) return t.opArg;
  const unsigned char* p = static_cast<const unsigned char*>(sp.scalar);
  uint64_t bits = 0;
  for (int i = 0; i < int(t.unitSize) && i < 8; ++i) bits |= uint64_t(p[i]) << (8 * i);
  return bits;
}

// Whether `peer` is a rank of another host (its entry is a window the network proxy serves,
// hip/device_conn.h: ProxyWindowLayout), and the entry without that bit.
__device__ inline bool PeerProxied(const KernelArgs& a, int peer) {
  return (uintptr_t(a.regions[peer]) & kProxiedPeer) != 0;
}
__device__ inline char* PeerBase(const KernelArgs& a, int peer) {
  return reinterpret_cast<char*>(uintptr_t(a.regions[peer]) & ~kProxiedPeer);
}

__device__ inline ConnHeader* RecvConn(const KernelArgs& a, int ch, int peer) {
  if (PeerProxied(a, peer)) {
    return reinterpret_cast<ConnHeader*>(PeerBase(a, peer) +
                                         ProxyWindowLayout::HeaderOffset(ch, 1));
  }
  return reinterpret_cast<ConnHeader*>(a.regions[a.rank] +
                                       RegionLayout::HeaderOffset(a.geo, ch, peer));
}
__device__ inline ConnHeader* SendConn(const KernelArgs& a, int ch, int peer) {
  if (PeerProxied(a, peer)) {
    return reinterpret_cast<ConnHeader*>(PeerBase(a, peer) +
                                         ProxyWindowLayout::HeaderOffset(ch, 0));
  }
  return reinterpret_cast<ConnHeader*>(a.regions[peer] +
                                       RegionLayout::HeaderOffset(a.geo, ch, a.rank));
}
__device__ inline char* RecvSlot(const KernelArgs& a, int ch, int peer, int proto, uint64_t s) {
  if (PeerProxied(a, peer))
    return PeerBase(a, peer) + ProxyWindowLayout::SlotOffset(a.geo, ch, 1, s);
  return a.regions[a.rank] + RegionLayout::SlotOffset(a.geo, ch, peer, proto, s);
}
__device__ inline char* SendSlot(const KernelArgs& a, int ch, int peer, int proto, uint64_t s) {
  if (PeerProxied(a, peer))
    return PeerBase(a, peer) + ProxyWindowLayout::SlotOffset(a.geo, ch, 0, s);
  return a.regions[peer] + RegionLayout::SlotOffset(a.geo, ch, a.rank, proto, s);
}

// The sender's side of connection (ch, this rank -> peer) lives in this rank's own region, in the
// header of the reverse connection (ch, peer -> this rank), whose pads are otherwise unused (Direct
// uses the pads of the header from a rank to itself, indices below 8): its own copy of the tail it
// sent, and the head the peer consumed, which the peer writes there. Every counter a rank polls or
// reloads is then in its own memory; across GPUs only stores cross the link. (A rank of another
// host: both headers are in its window, where the network proxy reads and writes them.)
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

// Whether to give up a wait: the abort word is raised, or the deadline passed (reported).
__device__ inline bool ShouldStop(const KernelArgs& a, uint64_t deadline, int ch, int peer,
                                  bool recv, uint64_t step) {
  if (*a.abort != 0) {
    RecordFailure(a, kDevAborted, ch, peer, recv, step);
    return true;
  }
  if (NowNs() > deadline) {
    Report(a, kDevTimeout, ch, peer, recv, step);
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
    if (++spins == kSpinsPerAbortCheck) {
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

// Calls body(BoolTag<kIn>, BoolTag<kSrc>) with the piece's operands as compile-time flags: a
// received slot and a source, the slot only, or the source only.
template <bool B>
struct BoolTag {
  static constexpr bool value = B;
};
template <typename Body>
__device__ inline bool ByOperands(const PieceIo& io, Body body) {
  if (io.in != nullptr && io.src != nullptr) return body(BoolTag<true>{}, BoolTag<true>{});
  if (io.in != nullptr) return body(BoolTag<true>{}, BoolTag<false>{});
  return body(BoolTag<false>{}, BoolTag<true>{});
}

// ---- the protocols, one type each ----
//
// A protocol type holds everything of a FIFO step that depends on the protocol, so that the piece
// machinery (DoPiece) and the programs are written once and instantiated per protocol; an element
// picks its protocol once (ByProto), never per piece:
//   kId            its Proto value: the group of slots it uses in every connection;
//   kTailSignals   whether the tail counter says the data is there (Simple: the sender fences,
//                  then posts tail; the receiver waits for it and fences), or the lines' own flags
//                  do (LL, LL128: the receiver polls them, the counters only free slots);
//   DataBytes      the payload of one step of stepBytes (the rest of the slot carries flags);
//   SlotBytes      the bytes of its slot a step of `bytes` of payload writes (flags included):
//                  what the network proxy ships for a peer on another host;
//   DataReady      thread 0's test, without waiting, that the step `rs` from `peer` holds data;
//   Move           the data of one piece: reads the received slot and the source, reduces,
//                  writes the destination and the slot to send (waiting for the lines' flags
//                  where the protocol has them); false when such a wait gave up.
struct ProtoSimple {
  static constexpr int kId = kProtoSimple;
  static constexpr bool kTailSignals = true;
  __device__ static int64_t DataBytes(int64_t stepBytes) { return stepBytes; }
  __device__ static int64_t SlotBytes(int64_t bytes) { return bytes; }
  __device__ static bool DataReady(const KernelArgs& a, int ch, int peer, uint64_t rs) {
    return LoadVolatile64(&RecvConn(a, ch, peer)->tail) > rs;
  }
  template <typename F, bool kIn, bool kSrc>
  __device__ static bool Move(const F& fn, const PieceIo& io, int64_t n, uint64_t, uint64_t,
                              const KernelArgs&, uint64_t, int, int) {
    SimpleLoop<F, kIn, kSrc>(fn, io, n);
    return true;
  }
};

struct ProtoLL {
  static constexpr int kId = kProtoLL;
  static constexpr bool kTailSignals = false;
  // Half of every line is its flags.
  __device__ static int64_t DataBytes(int64_t stepBytes) { return stepBytes / 2; }
  // A line of 16 bytes per word of 8.
  __device__ static int64_t SlotBytes(int64_t bytes) { return (bytes + 7) / 8 * 16; }
  __device__ static uint64_t Flag(uint64_t step) { return LLFlags(step); }
  // The first line's step flag (a line of another call is then found by the move).
  __device__ static bool DataReady(const KernelArgs& a, int ch, int peer, uint64_t rs) {
    const uint4 line = LoadVolatile(reinterpret_cast<const uint4*>(RecvSlot(a, ch, peer, kId, rs)));
    return line.y == LLFlag(rs);
  }
  template <typename F, bool kIn, bool kSrc>
  __device__ static bool Move(const F& fn, const PieceIo& io, int64_t n, uint64_t rs, uint64_t ss,
                              const KernelArgs& a, uint64_t deadline, int ch, int peer) {
    return LLLoop<F, kIn, kSrc>(fn, io, n, Flag(rs), Flag(ss), a, deadline, ch, peer);
  }
};

struct ProtoLL128 {
  static constexpr int kId = kProtoLL128;
  static constexpr bool kTailSignals = false;
  // kLL128DataWords data words of every 128-byte line.
  __device__ static int64_t DataBytes(int64_t stepBytes) {
    return stepBytes / kLL128LineBytes * (kLL128DataWords * 8);
  }
  // Whole lines of kLL128DataWords words each.
  __device__ static int64_t SlotBytes(int64_t bytes) {
    return ((bytes + 7) / 8 + kLL128DataWords - 1) / kLL128DataWords * kLL128LineBytes;
  }
  __device__ static uint64_t Flag(uint64_t step) { return LL128Flag(step); }
  // The first line's flag word (the upper half of its lane-7 access) carries the step (a line of
  // another call is then found by the move).
  __device__ static bool DataReady(const KernelArgs& a, int ch, int peer, uint64_t rs) {
    const uint4 q =
        LoadVolatile(reinterpret_cast<const uint4*>(RecvSlot(a, ch, peer, kId, rs)) + 7);
    return uint32_t(HiWord(q)) == uint32_t(Flag(rs));
  }
  template <typename F, bool kIn, bool kSrc>
  __device__ static bool Move(const F& fn, const PieceIo& io, int64_t n, uint64_t rs, uint64_t ss,
                              const KernelArgs& a, uint64_t deadline, int ch, int peer) {
    return LL128Loop<F, kIn, kSrc>(fn, io, n, Flag(rs), Flag(ss), a, deadline, ch, peer);
  }
};

// Calls body(P{}) with the protocol type of `proto` (a Proto value): the one place a protocol
// number becomes a type. An unknown value runs as Simple, as the numbers' users did before. AMD
// builds have no LL128 (their uploads refuse it: a 16-byte access there is two 8-byte ones), so
// they instantiate nothing for it.
template <typename Body>
__device__ inline bool ByProto(int proto, Body body) {
  switch (proto) {
    case kProtoLL:
      return body(ProtoLL{});
#if !defined(JAX_RCCL_AMD)
    case kProtoLL128:
      return body(ProtoLL128{});
#endif
    default:
      return body(ProtoSimple{});
  }
}

// The piece's data with its operands as compile-time flags.
template <typename F, typename P>
__device__ bool RunPieceData(const F& fn, const PieceIo& io, int64_t n, uint64_t rs, uint64_t ss,
                             const KernelArgs& a, uint64_t deadline, int ch, int peer) {
  return ByOperands(io, [&](auto in, auto src) {
    constexpr bool kIn = decltype(in)::value, kSrc = decltype(src)::value;
    return P::template Move<F, kIn, kSrc>(fn, io, n, rs, ss, a, deadline, ch, peer);
  });
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
  int nTrace;  // timeline words this block wrote (KernelArgs::trace)
  int cPeer[kConnCache];
  int cSend[kConnCache];
  uint64_t cStep[kConnCache];  // this block's counter: head (receiving) or tail (sending)
  uint64_t cSeen[kConnCache];  // the peer's counter last seen: tail (receiving) or head (sending)
};

// Thread 0 records `event` in the launch's timeline, when the launch has one.
__device__ inline void Trace(const KernelArgs& a, BlockShared* sh, uint32_t event) {
  if (a.trace == nullptr || threadIdx.x != 0) return;
  const int i = sh->nTrace;
  if (i >= kTraceEvents) return;
  sh->nTrace = i + 1;
  a.trace[int64_t(blockIdx.x) * kTraceEvents + i] =
      (uint64_t(event) << 56) | (NowNs() & ((uint64_t(1) << 56) - 1));
}

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

// Units of one step of protocol P for elements of `unitSize` bytes.
template <typename P>
__device__ inline int64_t StepCap(const KernelArgs& a, int unitSize) {
  return P::DataBytes(a.geo.stepBytes[P::kId]) / unitSize;
}

// One piece of primitive `p` (units [lo, lo + m) of it): waits for its FIFO steps, moves the data,
// publishes the steps. Uniform across the block; false when a wait gave up.
template <typename F, typename P>
__device__ bool DoPiece(const F& fn, const KernelArgs& a, uint64_t deadline, int ch, const Prim& p,
                        int64_t lo, int64_t m, int unitSize, const SlotPtrs& sp, BlockShared* sh) {
  const bool recv = (p.flags & kRecv) != 0, send = (p.flags & kSend) != 0;
  int i = -1, j = -1;  // thread 0: the cache entries of this piece's two ends
  Trace(a, sh, kTracePiece);
  // A peer of another host: its steps arrive by the proxy's copy, which only tail orders.
  const bool recvTail = recv && (P::kTailSignals || PeerProxied(a, p.recvPeer));
  if (threadIdx.x == 0) {
    bool ok = true;
    uint64_t rs = 0, ss = 0;
    sh->fail = 0;
    if (recv) {
      ConnHeader* c = RecvConn(a, ch, p.recvPeer);
      i = ConnSlot(sh, false, p.recvPeer, &c->head);
      rs = sh->cStep[i];
      if (recvTail && sh->cSeen[i] < rs + 1) {
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
    if (recvTail) {
      // A proxied step was written by the host: acquire at system scope.
      const bool proxied = PeerProxied(a, p.recvPeer);
      if (P::kTailSignals && !proxied) {
        __threadfence();
      } else {
        __threadfence_system();
      }
      // Its word says which call it belongs to (hip/kernel_check.h).
      if (ok) ok = CheckStepWord(a, RecvConn(a, ch, p.recvPeer), proxied, ch, p.recvPeer, rs);
    }
    Trace(a, sh, kTraceReady);
    sh->rs = rs;
    sh->ss = ss;
    sh->ok = ok ? 1 : 0;
  }
  __syncthreads();
  if (!sh->ok) return false;
  const uint64_t rs = sh->rs, ss = sh->ss;
  PieceIo io;
  if (recv) io.in = RecvSlot(a, ch, p.recvPeer, P::kId, rs);
  if (send) io.out = SendSlot(a, ch, p.sendPeer, P::kId, ss);
  if (p.flags & kSrcIn) io.src = static_cast<const char*>(sp.send) + (p.srcOff + lo) * unitSize;
  if (p.flags & kSrcOut) io.src = static_cast<const char*>(sp.recv) + (p.srcOff + lo) * unitSize;
  if (p.flags & kDst) io.dst = static_cast<char*>(sp.recv) + (p.dstOff + lo) * unitSize;
  io.pre = (p.flags & kSrcIn) != 0;
  io.post = (p.flags & kPostOp) != 0;
  const int64_t n = m * unitSize / int64_t(sizeof(typename F::Elem));
  bool ok = true;
  if (n > 0) {
    ok = RunPieceData<F, P>(fn, io, n, rs, ss, a, deadline, ch, recv ? p.recvPeer : p.sendPeer);
  }
  if (!ok) sh->fail = 1;
  __syncthreads();
  if (sh->fail) return false;
  Trace(a, sh, kTraceMoved);
  if (threadIdx.x == 0) {
    if (send) {
      ConnHeader* c = SendConn(a, ch, p.sendPeer);
      if (PeerProxied(a, p.sendPeer)) {
        // The proxy reads the step's protocol, size and tag, then its slot, once it sees tail.
        StoreVolatile64(&c->pad0[ss % kSteps],
                        ProxyInfo(P::kId, uint64_t(P::SlotBytes(m * unitSize)), gCallTag));
        __threadfence_system();
      } else if (P::kTailSignals) {
        if (a.checkCalls) StoreVolatile64(StepTagWord(c, ss), ProxyInfo(P::kId, 0, gCallTag));
        Fence(a);
      }
      StoreVolatile64(&c->tail, ss + 1);
      StoreVolatile64(SendTailMine(a, ch, p.sendPeer), ss + 1);
      sh->cStep[j] = ss + 1;
    }
    if (recv) {
      StoreVolatile64(&RecvConn(a, ch, p.recvPeer)->head, rs + 1);
      StoreVolatile64(HeadAtSender(a, ch, p.recvPeer), rs + 1);
      sh->cStep[i] = rs + 1;
    }
  }
  Trace(a, sh, kTracePosted);
  return true;
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
