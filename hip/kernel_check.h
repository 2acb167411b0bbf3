// The call check of the collective kernels (hip/device_conn.h, "The call check"), and how a
// launch records a failure. Device code only.
//
// Each block keeps its call's number and tag in shared memory (gCallSeq, gCallTag), set by
// CollKernelBody from its counter (one per block of a launch) before its first barrier. What a step
// carries:
//   LL       every line {lo, flag, hi, flag ^ tag}: a line is fresh when both flag words are the
//            ones this rank expects; a line whose first flag word is this step's but whose second
//            is not (and stays so) comes from a peer that runs another call;
//   LL128    the flag word of every line, step + 1 with the tag folded into its upper half;
//   Simple   the step's word in the receiver's header (StepTagWord), stored before the fence that
//            orders the step's data before tail, and read after tail;
//   proxied  the step's info word, carried with the step by the network proxies.
// A receiver that finds another tag records kDevMismatch (the tag it saw) and raises the abort
// word before it uses a byte of the step. With JAX_RCCL_CHECK_CALLS=0 nothing is tagged (the tag
// is 0, which a line's flags then carry as they did before the check) and nothing is counted.
#pragma once

#include <stdint.h>

#include "hip/device_conn.h"
#include "hip/portability.h"

namespace jax_rccl {
namespace gpu {
namespace {

// This block's call number on the communicator and the launch's tag (0: unchecked).
__shared__ uint64_t gCallSeq;
__shared__ uint32_t gCallTag;

__device__ inline uint64_t LoadVolatile64(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}
__device__ inline void StoreVolatile64(uint64_t* p, uint64_t v) {
  *reinterpret_cast<volatile uint64_t*>(p) = v;
}

// Records `code` and where it happened in the rank's status word, unless a failure is already
// recorded there (the first one wins); whether it was recorded.
__device__ inline bool RecordFailure(const KernelArgs& a, DevFailure code, int ch, int peer,
                                     bool recv, uint64_t step, uint32_t seen = 0,
                                     int seenBits = 0) {
  if (atomicCAS(&a.status->code, kDevFine, code) != kDevFine) return false;
  a.status->rank = a.rank;
  a.status->channel = ch;
  a.status->peer = peer;
  a.status->waitingRecv = recv ? 1 : 0;
  a.status->step = step;
  a.status->call = a.callId;
  a.status->seq = gCallSeq;
  a.status->mine = gCallTag;
  a.status->seen = seen;
  a.status->seenBits = seenBits;
  __threadfence_system();
  a.status->complete = 1;
  return true;
}

// Records the first failure of this rank and raises the communicator's abort word.
__device__ void Report(const KernelArgs& a, DevFailure code, int ch, int peer, bool recv,
                       uint64_t step) {
  if (RecordFailure(a, code, ch, peer, recv, step)) __threadfence_system();
  *a.abort = 1;
}

// A step from `peer` carried tag `seen` (its low `bits` bits) instead of this launch's.
__device__ void ReportMismatch(const KernelArgs& a, int ch, int peer, uint64_t step, uint32_t seen,
                               int bits) {
  if (RecordFailure(a, kDevMismatch, ch, peer, true, step, seen, bits)) __threadfence_system();
  *a.abort = 1;
}

// ---- the call's number, kept on the device ----

// Call counter `i` in this rank's region (one per channel's self header, i < nChannels).
__device__ inline uint64_t* CallSeqWord(const KernelArgs& a, int i) {
  return &reinterpret_cast<ConnHeader*>(a.ownRegion + RegionLayout::HeaderOffset(a.geo, i, a.rank))
              ->pad1[kCallSeqPad];
}
// Thread 0 at the block's start: counter blockIdx.x (a launch runs at most one block per channel,
// so every block has one of its own), an address of the launch's arguments alone, so the load is
// issued with the kernel's first instructions, ahead of the block's first dependent loads; then
// SetCall with it. A group of one rank has no region and no peer.
__device__ inline uint64_t LoadCallSeq(const KernelArgs& a) {
  return a.checkCalls && a.ownRegion != nullptr ? LoadVolatile64(CallSeqWord(a, int(blockIdx.x)))
                                                : 0;
}
__device__ inline void SetCall(const KernelArgs& a, uint64_t seq) {
  gCallSeq = seq;
  gCallTag = a.checkCalls ? CallTag(a.callId, seq) : 0u;
}
// Every thread, once the block's thread 0 has read its counter (SetCall, before the block's first
// barrier): the call's last launch advances every counter, block b its own and block 0 those no
// block of this launch reads (every counter then holds the number of calls made). At the start
// rather than the end, so that no store waits at the kernel's end: no block of this launch reads
// a counter after it moves, and the next launch reads them only once this one is done (stream
// order).
__device__ inline void AdvanceCall(const KernelArgs& a) {
  if (!a.checkCalls || !a.lastLaunch || a.ownRegion == nullptr) return;
  const int t = int(threadIdx.x);
  if (t == 0) StoreVolatile64(CallSeqWord(a, int(blockIdx.x)), gCallSeq + 1);
  if (blockIdx.x == 0 && t >= int(gridDim.x) && t < a.geo.nChannels) {
    StoreVolatile64(CallSeqWord(a, t), gCallSeq + 1);
  }
}

// ---- an exported program's device order ----

// Thread 0 at the block's start, after SetCall: whether this rank's device is the one the
// exported program placed at its partition (KernelArgs::deviceCheck; always, without one). A
// block of a rank on the wrong device records kDevWrongDevice, raises the abort word and moves
// nothing (the host checks the same at the first call where it can read the operand).
__device__ inline bool DeviceOrderOk(const KernelArgs& a) {
  if (a.deviceCheck == nullptr) return true;
  const int64_t lowered = a.deviceCheck[2];
  if (lowered == a.device) return true;
  if (atomicCAS(&a.status->code, kDevFine, kDevWrongDevice) == kDevFine) {
    a.status->rank = a.rank;
    a.status->channel = -1;
    a.status->peer = -1;
    a.status->step = uint64_t(a.deviceCheck[1]);
    a.status->call = a.callId;
    a.status->seq = gCallSeq;
    a.status->mine = gCallTag;
    a.status->seen64 = lowered;
    a.status->device = a.device;
    __threadfence_system();
    a.status->complete = 1;
  }
  __threadfence_system();
  *a.abort = 1;
  return false;
}

// ---- what the steps carry ----

// The flag of LL step `step`: never 0 (the value of lines never written), and, 2^32 - 1 being odd,
// a flag that comes round again lands in another slot than its last use.
__device__ inline uint32_t LLFlag(uint64_t step) {
  return 1u + uint32_t(step % 0xFFFFFFFFull);
}
// An LL line's two flag words for step `step` of this call: the step's flag (low half), and the
// flag xor the tag (high half).
__device__ inline uint64_t LLFlags(uint64_t step) {
  const uint32_t f = LLFlag(step);
  return (uint64_t(f ^ gCallTag) << 32) | f;
}
// The flag word of LL128 step `step` of this call: step + 1 with the tag folded into its upper
// half; never 0.
__device__ inline uint64_t LL128Flag(uint64_t step) {
  return (step + 1) ^ (uint64_t(gCallTag) << 32);
}
// Whether an LL line (its flag words y and w) belongs to step `flags` of another call: its step
// flag is this step's, its second word is not. *seen: the peer's tag.
__device__ inline bool LLOtherCall(uint32_t y, uint32_t w, uint64_t flags, uint32_t* seen) {
  *seen = w ^ y;
  return y == uint32_t(flags) && w != uint32_t(flags >> 32);
}
// The same for an LL128 flag word.
__device__ inline bool LL128OtherCall(uint64_t word, uint64_t flag, uint32_t* seen) {
  *seen = uint32_t((word ^ flag) >> 32) ^ gCallTag;
  return uint32_t(word) == uint32_t(flag) && word != flag;
}

// Thread 0, a step from `peer` whose tail it has seen (Simple, or any step of a rank of another
// host): whether the step's word carries this call's tag; reports the mismatch otherwise.
__device__ inline bool CheckStepWord(const KernelArgs& a, ConnHeader* c, bool proxied, int ch,
                                     int peer, uint64_t step) {
  if (!a.checkCalls) return true;
  const uint64_t w = LoadVolatile64(proxied ? &c->pad0[step % kSteps] : StepTagWord(c, step));
  const uint32_t seen = StepWordTag(w);
  if (seen == (gCallTag & kStepTagMask)) return true;
  ReportMismatch(a, ch, peer, step, seen, 24);
  return false;
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl
