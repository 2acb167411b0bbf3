// The work structs: what the planner writes and the kernels (and the CPU executor) read.
//
// Defined once, here, and included by host code and by device code under hip/, so both sides
// agree on every byte; the static_asserts below keep them in step. Plain C++ with fixed-width
// integers only: no standard-library types, nothing a device compiler cannot take.
//
// The layout follows RCCL's ncclWork (256-byte work, one header, a union of elements) with one
// change: elements name their buffers by slot (the task's index in the launch's argument table)
// instead of by pointer, so a persistent plan survives new buffer addresses.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace jax_rccl {

constexpr int kSteps = 8;                             // NCCL_STEPS: slots per connection FIFO
constexpr int kMaxChannels = 128;                     // MAXCHANNELS (RCCL)
constexpr int kMaxNThreads = 256;                     // NCCL_MAX_NTHREADS (RCCL)
constexpr int kWorkSize = 256;                        // NCCL_WORK_SIZE (RCCL)
constexpr int kLL128LineSize = 64;                    // NCCL_LL128_LINESIZE (RCCL)
constexpr int kLL128LineElems = kLL128LineSize / 8;   // NCCL_LL128_LINEELEMS
constexpr int kLL128DataElems = kLL128LineElems - 1;  // NCCL_LL128_DATAELEMS
constexpr int kLLAlignmentPerThread = 8;              // NCCL_LL_ALIGNMENT_PER_THREAD
constexpr int kBytesAlignment = 16;                   // NCCL_BYTES_ALIGNMENT
constexpr int kConnIdxP2pNet = 2;                     // NCCL_CONN_IDX_P2P_NET
// A FIFO step's info word for the network proxy, which carries it with the step: the protocol
// in the bits from kProxyInfoShift up, the call's tag in the 24 bits from kProxyTagShift, the
// bytes of the slot the step filled below (the kernels write it, hip/device_conn.h: ProxyInfo;
// ffi/comm/proxy.h reads it).
constexpr int kProxyInfoShift = 56;
constexpr int kProxyTagShift = 32;

enum WorkType : uint8_t {
  kWorkTypeUnused = 0,
  kWorkTypeColl = 1,
  kWorkTypeP2p = 2,
  kWorkTypeRegColl = 3,
};

enum WorkP2pType : uint8_t {
  kWorkP2pTypeUnused = 0,
  kWorkP2pTypeSend = 1,
  kWorkP2pTypeRecv = 2,
};

struct WorkHeader {
  union {
    int32_t workNext;   // isLast == 0: offset of the next work from the launch's work head
    uint32_t doneAcks;  // isLast == 1: value to ack back once this work is consumed (FIFO)
  };
  uint16_t funcIndex;  // which device function runs the work
  uint8_t isLast : 1;  // last work of this channel in this launch
  uint8_t inFifo : 1;  // the work sits in the FIFO ring (not a persistent plan)
  WorkType type;
};
static_assert(sizeof(WorkHeader) == 8, "WorkHeader is 8 bytes");

// One part of a collective on one channel.
struct WorkElemColl {
  union {
    uint8_t flagBits;
    struct {
      uint8_t isUsed : 1, redOpArgIsPtr : 1, regUsed : 1, oneNode : 1;
    };
  };
  uint8_t nWarps;
  uint8_t direct;
  uint8_t reserved0;
  uint32_t root : 30, connIndex : 2;
  uint32_t slot;  // the task's buffers in the launch's argument table
  uint32_t reserved1;
  uint64_t count : 39, opCount : 25;  // count: elements of the whole task
  uint64_t redOpArg;
  uint64_t chunkCount : 25, workCount : 39;  // workCount: elements of this part
  uint64_t lastChunkCount : 25, workOffset : 39;
};
static_assert(sizeof(WorkElemColl) == 48, "WorkElemColl is 48 bytes");

// One send or one receive of a point-to-point chunk.
struct WorkElemP2p {
  int32_t peer : 28;
  uint32_t connIndex : 2;
  int32_t proto : 2;
  union {
    uint16_t flagBits;
    struct {
      uint16_t p2pType : 4;  // WorkP2pType
      uint16_t nWarps : 4;
      uint16_t warpStart : 4;
      uint16_t ngroups : 4;
    };
  };
  uint16_t reg : 1, opCount : 12;
  uint32_t offsetLo;  // byte offset into the slot's buffer
  uint32_t offsetHi : 16, slot : 16;
  uint32_t countHi, countLo;  // bytes
  int32_t chunkSize;
};
static_assert(sizeof(WorkElemP2p) == 28, "WorkElemP2p is 28 bytes");

constexpr int kAlignUp(int x, int a) {
  return (x + a - 1) / a * a;
}
constexpr int kWorkElemFit =
    (kWorkSize - kAlignUp(sizeof(WorkHeader), alignof(WorkElemColl))) / sizeof(WorkElemColl);
constexpr int kWorkElemP2pFit =
    (kWorkSize - kAlignUp(sizeof(WorkHeader), alignof(WorkElemP2p))) / sizeof(WorkElemP2p);
static_assert(kWorkElemFit >= 4, "four collective elements fit in a work");
static_assert(kWorkElemP2pFit >= 8, "eight p2p elements fit in a work");

// RCCL batches one collective element and two p2p elements (a recv and a send) per work.
constexpr int kMaxWorkElements = 1;     // NCCL_MAX_WORK_ELEMENTS (RCCL)
constexpr int kMaxWorkElementsP2p = 2;  // NCCL_MAX_WORK_ELEMENTS_P2P (RCCL)

struct Work {
  WorkHeader header;
  union {
    char pad[kWorkSize - sizeof(WorkHeader)];
    WorkElemColl elems[kMaxWorkElements];
    WorkElemP2p p2pElems[kMaxWorkElementsP2p];
  };
};
static_assert(sizeof(Work) == kWorkSize, "Work is kWorkSize bytes");
static_assert(offsetof(Work, elems) == 8, "elements start after the 8-byte header");
static_assert(offsetof(WorkElemColl, redOpArg) == 24, "WorkElemColl.redOpArg at byte 24");
static_assert(offsetof(WorkElemP2p, chunkSize) == 24, "WorkElemP2p.chunkSize at byte 24");
static_assert(sizeof(Work) % 16 == 0, "Work is a multiple of 16 bytes");

// Channel masks over kMaxChannels channels.
struct ChannelMask {
  uint64_t masks[kMaxChannels / 64];
};

}  // namespace jax_rccl
