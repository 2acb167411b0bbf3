// The protocols as types (ProtoSimple, ProtoLL, ProtoLL128): everything of a FIFO step that
// depends on the protocol, chosen once per element (ByProto), and RunPieceData, which moves one
// piece's data with one (hip/kernel_piece.h). Device code only.
#pragma once

#include <stdint.h>

#include "hip/kernel_ll128.h"

namespace jax_rccl {
namespace gpu {
namespace {

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

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
