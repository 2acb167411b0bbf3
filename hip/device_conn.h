// The GPU connection layout and the kernel's argument block: shared by the host runtime
// (hip/runtime.hip) and the kernels (hip/kernel_impl.h). Plain C++ with fixed-width integers.
//
// Every rank owns one region of device memory holding the connections INTO it: for each channel
// and each sending rank a header (tail: steps the sender filled; head: steps the receiver
// consumed; both monotonic and kept across launches, so a replayed launch continues where the
// last one stopped) and, per protocol, kSteps slots of that protocol's step size. Senders write
// ("push") into the receiver's region; regions of other ranks are reached through peer pointers
// (one process) or IPC handles (several processes). Protocols have separate slots: an LL slot
// only ever holds LL lines, whose flags are the step number, so stale data never looks fresh.
#pragma once

#include <stdint.h>

#include "ffi/compute/dtypes.h"
#include "ffi/planner/work.h"

#define JR_REGION_FN JR_HOST_DEVICE inline

namespace jax_rccl {
namespace gpu {

constexpr int kNumProtocols = 3;  // LL, LL128, Simple (Proto's values)
constexpr int kProtoLL = 0;
constexpr int kProtoLL128 = 1;
constexpr int kProtoSimple = 2;

// The sizes every rank of a communicator derives from its topology alone.
struct Geometry {
  int32_t nRanks = 0;
  int32_t nChannels = 0;
  int64_t stepBytes[kNumProtocols] = {0, 0, 0};  // buffSizes[p] / kSteps (16-byte multiples)
};

// The pads carry the other direction's sender state (hip/kernel_addr.h: SendTailMine) and, in the
// header from a rank to itself, Direct's handshake words.
struct alignas(128) ConnHeader {
  uint64_t tail;  // written by the sender
  uint64_t pad0[15];
  uint64_t head;  // written by the receiver
  uint64_t pad1[15];
};
static_assert(sizeof(ConnHeader) == 256, "ConnHeader is 256 bytes");
// The pad index of a sender's words (hip/kernel_addr.h: SendTailMine); Direct uses those below.
constexpr int kSendPad = 8;

struct RegionLayout {
  static constexpr int64_t kHeaderBytes = sizeof(ConnHeader);
  JR_REGION_FN static int64_t ConnIndex(const Geometry& g, int channel, int from) {
    return int64_t(channel) * g.nRanks + from;
  }
  JR_REGION_FN static int64_t HeaderOffset(const Geometry& g, int channel, int from) {
    return ConnIndex(g, channel, from) * kHeaderBytes;
  }
  JR_REGION_FN static int64_t ConnDataBytes(const Geometry& g) {
    int64_t b = 0;
    for (int p = 0; p < kNumProtocols; ++p) b += int64_t(kSteps) * g.stepBytes[p];
    return b;
  }
  JR_REGION_FN static int64_t DataStart(const Geometry& g) {
    const int64_t end = int64_t(g.nChannels) * g.nRanks * kHeaderBytes;
    return (end + 4095) / 4096 * 4096;
  }
  // Slot `step % kSteps` of protocol `proto` of connection (channel, from).
  JR_REGION_FN static int64_t SlotOffset(const Geometry& g, int channel, int from, int proto,
                                         uint64_t step) {
    int64_t off = DataStart(g) + ConnIndex(g, channel, from) * ConnDataBytes(g);
    for (int p = 0; p < proto; ++p) off += int64_t(kSteps) * g.stepBytes[p];
    return off + int64_t(step % kSteps) * g.stepBytes[proto];
  }
  JR_REGION_FN static int64_t Bytes(const Geometry& g) {
    return DataStart(g) + int64_t(g.nChannels) * g.nRanks * ConnDataBytes(g);
  }
};

// A rank of another host, as the kernels of this host see it: a window in host memory that the
// device maps (ffi/gpu/comm_net.cc), which the network proxy (ffi/comm/proxy.h) serves. It holds,
// per channel, both connections between this process's rank and that rank: direction 0 (this rank
// sends) and 1 (this rank receives), each a header and kSteps slots. A slot holds a step of any
// protocol (slotBytes: the largest step), so that the proxy receives a step in place before it
// knows its protocol. The headers keep the counters as a region's do (hip/kernel_addr.h), with the
// sender's words of direction 0 in direction 1's header, as for any peer. The kernels tell such a
// peer by bit 0 of its entry in the region table (KernelArgs::regions; regions are 4096-byte
// aligned), and then:
//   sending     write the step's info word (direction 0's pad0[step % kSteps]: protocol and
//               bytes, ProxyInfo) and fence at system scope before posting tail, whatever the
//               protocol;
//   receiving   wait for tail whatever the protocol: the proxy posts tail once the step's bytes
//               are in, and the network orders no LL or LL128 flag after its line's data.
constexpr uintptr_t kProxiedPeer = 1;
// The bits of a call's tag a Simple or proxied step's word carries (hip/kernel_check.h).
constexpr uint32_t kStepTagMask = 0xffffffu;
JR_REGION_FN uint64_t ProxyInfo(int proto, uint64_t bytes, uint32_t tag = 0) {
  return (uint64_t(proto) << kProxyInfoShift) | (uint64_t(tag & kStepTagMask) << kProxyTagShift) |
         bytes;
}

struct ProxyWindowLayout {
  JR_REGION_FN static int64_t SlotBytes(const Geometry& g) {
    int64_t b = 0;
    for (int p = 0; p < kNumProtocols; ++p) b = g.stepBytes[p] > b ? g.stepBytes[p] : b;
    return b;
  }
  // Direction `dir` of `channel`: its header.
  JR_REGION_FN static int64_t HeaderOffset(int channel, int dir) {
    return (int64_t(channel) * 2 + dir) * int64_t(sizeof(ConnHeader));
  }
  JR_REGION_FN static int64_t DataStart(const Geometry& g) {
    return (int64_t(g.nChannels) * 2 * int64_t(sizeof(ConnHeader)) + 4095) / 4096 * 4096;
  }
  // Slot `step % kSteps` of direction `dir` of `channel`.
  JR_REGION_FN static int64_t SlotOffset(const Geometry& g, int channel, int dir, uint64_t step) {
    return DataStart(g) +
           ((int64_t(channel) * 2 + dir) * kSteps + int64_t(step % kSteps)) * SlotBytes(g);
  }
  // The bytes of a window whose first `channels` channels are used (the geometry's count keeps
  // every channel's offsets).
  JR_REGION_FN static int64_t Bytes(const Geometry& g, int channels) {
    return DataStart(g) + int64_t(channels) * 2 * kSteps * SlotBytes(g);
  }
};

// The kernel class of data movement (all_gather, broadcast, send/recv); reductions use their
// DataType's value as their class (one kernel per class, see hip/kernel_impl.h).
constexpr int kCopyClass = 255;

// ---- The call check (hip/kernel_check.h) ----
//
// Every rank of a group counts its calls on the communicator on the device: nChannels counters in
// the rank's own region (CallSeqWord), all equal between calls; block b of a launch reads the
// b-th, and the call's last launch advances them all, so that a graph replayed without the host
// counts like a launch. A launch's tag is CallTag(call identity, call number): a sender folds it
// into what each FIFO step already carries (LL: the second flag word of every line is the step's
// flag xor the tag; LL128: the upper half of each line's flag word; Simple: the step's word in the
// receiver's connection header, StepTagWord, written before tail; a peer of another host: the
// step's info word, whose bits [kProxyTagShift, kProxyTagShift + 24) the network proxies carry to
// the receiving window's header, ProxyWindowLayout, direction 1's pad0[step % kSteps]). A receiver
// compares the tag of every step with its own before it uses a byte of it.

// The tag of call number `seq` of the call `call` (its identity, already a hash of the call
// site and the plan): the identity's low word stepped by an odd constant per number, shifted up
// over a set low bit, so that it is never 0 (0 is an untagged step), not even in the low 24 bits
// that Simple steps and proxies carry, and two numbers of one call less than 2^23 apart never
// share those 24 bits. One multiply-add: it lies on every launch's critical path.
JR_REGION_FN uint32_t CallTag(uint64_t call, uint64_t seq) {
  const uint32_t h = uint32_t(call) + uint32_t(seq + 1) * 0x9e3779b1u;
  return (h << 1) | 1u;
}
JR_REGION_FN uint32_t StepWordTag(uint64_t word) {
  return uint32_t(word >> kProxyTagShift) & kStepTagMask;
}
// Where a Simple step's word lies in the receiver's header of a connection within a host (the
// spare words neither the sender's counters, kSendPad, nor Direct's boxes use).
JR_REGION_FN uint64_t* StepTagWord(ConnHeader* c, uint64_t step) {
  const int i = int(step % kSteps);
  return i < 6 ? &c->pad0[9 + i] : &c->pad1[3 + i];
}
// The call counter of `channel` in a rank's own region: a spare word of the header of the
// connection from the rank to itself (which carries no FIFO step).
constexpr int kCallSeqPad = 12;
static_assert(3 + kSteps - 1 < kCallSeqPad,
              "the Simple steps' tag words lie below the call counter");

// One task of a launch, as the kernel needs it (indexed by the task's slot).
struct DevTask {
  uint8_t coll;     // Coll
  uint8_t pattern;  // Pattern
  uint8_t dtype;    // DataType of the reduction (copies: kUint8)
  uint8_t op;       // DevRedOp (copies: kSum, unused)
  uint8_t proto;    // Proto
  uint8_t unitSize;
  uint8_t copy;     // a data movement (all_gather, broadcast, send/recv): bytes, no reduction
  uint8_t argKind;  // DevTaskArg: what opArg holds
  uint64_t opArg;   // the op's argument (kArgValue), or a ragged transfer's entry (kArgRagged)
};

// What DevTask::opArg holds.
enum DevTaskArg : uint8_t {
  kArgValue = 0,   // the op's argument itself
  kArgScalar = 1,  // nothing: the op's argument is read at run time from the slot's `scalar`
  kArgRagged = 2,  // a ragged_all_to_all transfer: RaggedEntry(sender, slice) of the slot's table
};

// A ragged_all_to_all transfer's table entry: slice `slice` of rank `sender`'s rows of the table.
JR_REGION_FN uint64_t RaggedEntry(int sender, int64_t slice) {
  return (uint64_t(uint32_t(sender)) << 40) | uint64_t(slice);
}
JR_REGION_FN int RaggedSender(uint64_t entry) {
  return int(entry >> 40);
}
JR_REGION_FN int64_t RaggedSlice(uint64_t entry) {
  return int64_t(entry & ((uint64_t(1) << 40) - 1));
}

// The shapes of a ragged_all_to_all launch (slices 0: none): operand [inRows, R], output
// [outRows, R] (R elements are rowBytes), and the table of every rank's (input_offsets,
// send_sizes, output_offsets, recv_sizes), `slices` int32 or int64 values each
// (ffi/handlers/ragged.h).
struct RaggedDims {
  int64_t inRows;
  int64_t outRows;
  int64_t rowBytes;
  int32_t slices;
  int32_t table64;
};

// Where one block starts: its channel and the index of its first work in the work array.
struct BlockInfo {
  int32_t channel;
  int32_t firstWork;
};

// One task's buffers in one launch. `scalar`: a per-device PreMulSum scalar (one element of the
// task's type in device memory, read by the kernel when it runs), or null; `table`: a
// ragged_all_to_all transfer's offsets table (device memory, read by the kernel when it runs).
struct SlotPtrs {
  const void* send;
  void* recv;
  union {
    const void* scalar;
    const void* table;
  };
};

// Why a rank's launch stopped (DevStatus::code).
enum DevFailure : int32_t {
  kDevFine = 0,
  kDevTimeout = 1,       // a wait passed its deadline (JAX_RCCL_TIMEOUT)
  kDevAborted = 2,       // another rank of the communicator failed first
  kDevTooManyRanks = 3,  // a Direct element on more than kMaxDirectRanks ranks (the plan's upload
                         // refuses such plans first: a guard of the kernel itself)
  kDevBadRagged = 4,     // a ragged_all_to_all table entry out of range (peer: the sender, step:
                         // the slice); both ends of the transfer moved nothing for it
  kDevMismatch = 5,      // a step from `peer` carried another call's tag (`seen`; 0: untagged)
  kDevWrongDevice = 6,   // an exported program's partition `step` was lowered for device `seen64`
                         // and runs on this rank's device (KernelArgs::deviceCheck); nothing moved
};

// The most ranks the Direct algorithm's kernel holds (its per-peer tables in shared memory).
constexpr int kMaxDirectRanks = 64;

// Polls of a FIFO counter between two checks of the abort word and the deadline (each check
// reads host-mapped memory and the clock, so a wait does it only every so often).
constexpr int kSpinsPerAbortCheck = 512;

// What a failed wait reports (host-mapped memory, read by the host after or between launches).
struct DevStatus {
  int32_t code;  // DevFailure
  int32_t rank;
  int32_t channel;
  int32_t peer;
  int32_t waitingRecv;  // 1: waited for data from peer; 0: for room in peer's FIFO
  int32_t pad;
  uint64_t step;
  uint64_t call;  // the launch's call identity (KernelArgs::callId)
  uint64_t seq;   // the call's number on the communicator (the device's count)
  uint32_t mine;  // the launch's tag (0: unchecked)
  uint32_t seen;  // kDevMismatch: the tag the step carried (24 bits for a Simple or proxied step)
  int32_t seenBits;
  int32_t complete;  // 1 once the fields above are written (the host waits for it to read them)
  int64_t seen64;    // kDevWrongDevice: the device the partition was lowered for
  int64_t device;    // kDevWrongDevice: this rank's device
};

constexpr int kInlineSlots = 24;
// Tasks a block keeps in shared memory (a launch with more reads them from device memory).
constexpr int kSharedTasks = 32;

// A launch's timeline (the harness's trace): per block up to kTraceEvents words, each the event
// (TraceEvent, top 8 bits) and the device clock in ns (low 56 bits); unused words stay 0.
constexpr int kTraceEvents = 64;
enum TraceEvent : uint32_t {
  kTraceStart = 1,   // the block began
  kTraceWork = 2,    // a work was loaded into shared memory
  kTracePiece = 3,   // a piece began (thread 0, before its waits)
  kTraceReady = 4,   // the piece's waits were satisfied
  kTraceMoved = 5,   // the piece's data moved (after the block's barrier)
  kTracePosted = 6,  // the piece's counters were posted
  kTraceEnd = 7,     // the block finished its works
  kTraceElem = 8,    // a work's element began (its task loaded)
};

// Threads per block of a launch: the plan's count, raised to kMinLaunchThreads on NVIDIA (its
// cost model allows up to 640; the kernels move 16-byte packs and want many in flight) and capped
// at kMaxLaunchThreads (the kernels' launch bound).
constexpr int kMaxLaunchThreads = 512;
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
constexpr int kMinLaunchThreads = 256;
#else
constexpr int kMinLaunchThreads = 512;
#endif

struct KernelArgs {
  const Work* works;
  const BlockInfo* blocks;
  const DevTask* tasks;
  char* const* regions;       // [nRanks]: every rank's region as this rank's device sees it
                              // (bit 0 set: a rank of another host's window, ProxyWindowLayout)
  const SlotPtrs* slotTable;  // nSlots > kInlineSlots: the slots in device memory
  char* ownRegion;            // regions[rank], read without loading the table (the call counters)
  DevStatus* status;          // this rank's
  volatile int32_t* abort;    // the communicator's: set on any failure, polled by waits
  uint64_t* trace;            // null, or [blocks][kTraceEvents] timeline words (hip/kernel_piece.h)
  uint64_t timeoutNs;
  Geometry geo;
  int32_t rank;
  int32_t nRanks;
  int32_t nSlots;
  int32_t systemFence;  // peers on other devices or processes
  // The call check (hip/kernel_check.h): the call's identity, whether steps are tagged and
  // checked (JAX_RCCL_CHECK_CALLS), and whether this launch is the call's last (it advances the
  // counters).
  uint64_t callId;
  int32_t checkCalls;
  int32_t lastLaunch;
  RaggedDims ragged;  // a ragged_all_to_all plan's shapes (slices 0: none)
  // A program exported with jax.export whose first call was recorded into a command buffer: its
  // device check {magic, partition, device lowered there} (ffi/handlers/common.h), compared by
  // every block with `device` before it moves anything (null: none, or checked by the host).
  const int64_t* deviceCheck;
  int64_t device;
  SlotPtrs inlineSlots[kInlineSlots];
};

}  // namespace gpu
}  // namespace jax_rccl
