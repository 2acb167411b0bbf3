// Where a connection's counters and slots lie as a kernel sees them, and the bounded waits on
// them (the abort word, the deadline): the addressing every data path of the collective kernels
// (hip/kernel_piece.h) uses. Device code only.
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

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
