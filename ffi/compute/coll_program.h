// The program of one collective work element, shared by the CPU executor and the HIP kernels: a
// sequence of primitives (send, recvReduceSend, recvReduceCopySend, recvCopySend, recv, ...)
// over the element's chunks, after RCCL's device code (src/device/all_reduce.h, all_gather.h,
// reduce_scatter.h, broadcast.h, reduce.h). Each primitive names what it reads and writes, the
// peers it receives from and sends to, and its offsets; both executors move its elements through
// the FIFO in pieces of at most one step (PieceCount / PieceUnits, identical on every rank).
//
// Ring position = rank (ring next = rank + 1); Tree is the chain of one node (rank 0 the root,
// up = rank - 1, down = rank + 1). Integer arithmetic only: compiles for host and device.
#pragma once

#include <stdint.h>

#include "ffi/compute/dtypes.h"
#include "ffi/planner/types.h"
#include "ffi/planner/work.h"

namespace jax_rccl {

// What one primitive reads and writes.
enum PrimFlag : uint8_t {
  kRecv = 1,     // takes a FIFO step from recvPeer
  kSend = 2,     // fills a FIFO step for sendPeer
  kSrcIn = 4,    // reads this rank's input (send buffer), through PreOp
  kSrcOut = 8,   // reads this rank's output buffer (tree down from the root)
  kDst = 16,     // writes this rank's output (recv buffer)
  kPostOp = 32,  // the final value: applies PostOp
};

struct Prim {
  uint8_t flags = 0;
  int recvPeer = -1;
  int sendPeer = -1;
  int64_t srcOff = 0;  // units into the source buffer
  int64_t dstOff = 0;  // units into the destination buffer
  int64_t n = 0;       // units (elements of the planning type; bytes for gathers/broadcasts/p2p)
};

JR_INLINE int64_t ProgDivUp(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
JR_INLINE int64_t ProgMin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
JR_INLINE int64_t ProgMax(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// Primitives in element `e` of a task with `pattern` over `n` ranks (0: nothing to run, or a
// pattern without a program).
JR_INLINE int64_t CollOpCount(Pattern pattern, const WorkElemColl& e, int n) {
  const int64_t workCount = int64_t(e.workCount);
  const int64_t chunk = int64_t(e.chunkCount);
  if (workCount == 0 || chunk == 0) return 0;
  const int64_t nChunks = ProgDivUp(workCount, chunk);
  switch (pattern) {
    case Pattern::kRingTwice:
      return ProgDivUp(workCount, int64_t(n) * chunk) * (2 * n - 1);
    case Pattern::kRing:
      return nChunks * n;  // all_gather / reduce_scatter: n primitives per chunk
    case Pattern::kPipelineFrom:
    case Pattern::kPipelineTo:
      return nChunks;
    case Pattern::kTreeUpDown:
      return 2 * nChunks;
    default:
      return 0;
  }
}

// The i-th primitive of element `e` of a task (`coll`, `pattern`) on rank `r` of `n`.
JR_INLINE Prim CollPrim(Coll coll, Pattern pattern, const WorkElemColl& e, int r, int n,
                        int64_t i) {
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t gridOffset = int64_t(e.workOffset);
  const int64_t workCount = int64_t(e.workCount);
  const int64_t count = int64_t(e.count);
  Prim p;
  switch (pattern) {
    case Pattern::kRingTwice: {  // all_reduce
      const int64_t perLoop = 2 * n - 1;
      const int64_t loop = i / perLoop;
      const int64_t j = i % perLoop;
      const int64_t loopCount = int64_t(n) * int64_t(e.chunkCount);
      const int64_t elemOffset = loop * loopCount;
      const int64_t remCount = workCount - elemOffset;
      const int64_t chunkCount =
          remCount < loopCount ? int64_t(e.lastChunkCount) : int64_t(e.chunkCount);
      int chunk;
      if (j == 0) {
        chunk = (r + n - 1) % n;
        p.flags = kSrcIn | kSend;
      } else if (j < n - 1) {
        chunk = int((r + n - (j + 1)) % n);
        p.flags = kRecv | kSrcIn | kSend;
      } else if (j == n - 1) {
        chunk = r;
        p.flags = kRecv | kSrcIn | kDst | kSend | kPostOp;
      } else if (j < 2 * n - 2) {
        chunk = int((r + n - (j - n + 1)) % n);
        p.flags = kRecv | kDst | kSend;
      } else {
        chunk = (r + 1) % n;
        p.flags = kRecv | kDst;
      }
      const int64_t chunkOffset = int64_t(chunk) * chunkCount;
      p.srcOff = p.dstOff = gridOffset + elemOffset + chunkOffset;
      p.n = ProgMax(0, ProgMin(chunkCount, remCount - chunkOffset));
      break;
    }
    case Pattern::kRing: {  // all_gather, reduce_scatter
      const int64_t chunkCount = int64_t(e.chunkCount);
      const int64_t c = i / n;
      const int j = int(i % n);
      const int64_t elemOffset = c * chunkCount;
      const int64_t dataOffset = gridOffset + elemOffset;
      p.n = ProgMin(chunkCount, workCount - elemOffset);
      if (coll == Coll::kAllGather) {
        // Step j carries the block of the rank j positions behind on the ring.
        const int rankDest = (r + n - j) % n;
        const int64_t offset = dataOffset + int64_t(rankDest) * count;
        p.dstOff = offset;
        if (j == 0) {
          p.srcOff = dataOffset;
          p.flags = kSrcIn | kDst | kSend;
        } else if (j < n - 1) {
          p.flags = kRecv | kDst | kSend;
        } else {
          p.flags = kRecv | kDst;
        }
      } else {
        // Step j reduces the block of the rank (j + 1) positions behind; the last is mine.
        const int rankDest = (r + n - (j + 1)) % n;
        p.srcOff = dataOffset + int64_t(rankDest) * count;
        if (j == 0) {
          p.flags = kSrcIn | kSend;
        } else if (j < n - 1) {
          p.flags = kRecv | kSrcIn | kSend;
        } else {
          p.dstOff = dataOffset;
          p.flags = kRecv | kSrcIn | kDst | kPostOp;
        }
      }
      break;
    }
    case Pattern::kPipelineFrom:  // broadcast from the root along the ring
    case Pattern::kPipelineTo: {  // reduce to the root along the ring
      const int64_t chunkCount = int64_t(e.chunkCount);
      const int64_t elemOffset = i * chunkCount;
      p.srcOff = p.dstOff = gridOffset + elemOffset;
      p.n = ProgMin(chunkCount, workCount - elemOffset);
      const int root = int(e.root);
      if (pattern == Pattern::kPipelineFrom) {
        if (r == root) {
          p.flags = kSrcIn | kDst | kSend;
        } else if (next == root) {
          p.flags = kRecv | kDst;
        } else {
          p.flags = kRecv | kDst | kSend;
        }
      } else if (prev == root) {
        p.flags = kSrcIn | kSend;
      } else if (r == root) {
        p.flags = kRecv | kSrcIn | kDst | kPostOp;
      } else {
        p.flags = kRecv | kSrcIn | kSend;
      }
      break;
    }
    case Pattern::kTreeUpDown: {  // chain tree: rank 0 is the root, up = r - 1, down = r + 1
      const int64_t chunkCount = int64_t(e.chunkCount);
      const int64_t nChunks = ProgDivUp(workCount, chunkCount);
      const bool upPhase = i < nChunks;
      const int64_t c = upPhase ? i : i - nChunks;
      const int64_t elemOffset = c * chunkCount;
      p.srcOff = p.dstOff = gridOffset + elemOffset;
      p.n = ProgMin(chunkCount, workCount - elemOffset);
      const int up = r - 1;
      const int down = r + 1 < n ? r + 1 : -1;
      // Up: reduce from the leaf to the root (the root keeps the result); down: the root's
      // result back to the leaf.
      if (up < 0) {  // the root
        p.flags = upPhase ? kRecv | kSrcIn | kDst | kPostOp : kSrcOut | kSend;
      } else if (down < 0) {  // the leaf
        p.flags = upPhase ? kSrcIn | kSend : kRecv | kDst;
      } else {
        p.flags = upPhase ? kRecv | kSrcIn | kSend : kRecv | kDst | kSend;
      }
      p.recvPeer = upPhase ? down : up;
      p.sendPeer = upPhase ? up : down;
      return p;
    }
    default:
      break;
  }
  p.recvPeer = prev;
  p.sendPeer = next;
  return p;
}

// The i-th primitive of a point-to-point element (send or receive of `chunkSize`-byte chunks).
JR_INLINE Prim P2pPrim(const WorkElemP2p& e, int64_t i) {
  const int64_t bytes = int64_t((uint64_t(e.countHi) << 32) | e.countLo);
  const int64_t base = int64_t((uint64_t(e.offsetHi) << 32) | e.offsetLo);
  const int64_t off = i * int64_t(e.chunkSize);
  Prim p;
  p.n = ProgMax(0, ProgMin(int64_t(e.chunkSize), bytes - off));
  if (e.p2pType == kWorkP2pTypeSend) {
    p.flags = kSrcIn | kSend;
    p.sendPeer = e.peer;
    p.srcOff = base + off;
  } else {
    p.flags = kRecv | kDst;
    p.recvPeer = e.peer;
    p.dstOff = base + off;
  }
  return p;
}

// floor(a * b / d) for a, b <= d < 2^62, in 64-bit integers (host and device): the product in
// two 64-bit words, then a bitwise long division (the quotient fits in 64 bits as a, b <= d).
JR_INLINE uint64_t MulDivFloor(uint64_t a, uint64_t b, uint64_t d) {
  const uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
  const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  uint64_t hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
  const uint64_t lo = (mid << 32) | (p00 & 0xffffffffu);
  uint64_t q = 0, r = hi;  // r < d: the quotient's high word is 0
  for (int i = 63; i >= 0; --i) {
    r = (r << 1) | ((lo >> i) & 1);  // r < 2d < 2^63: no overflow
    q <<= 1;
    if (r >= d) {
      r -= d;
      q |= 1;
    }
  }
  return q;
}

// Where byte `edge` of a point-to-point task planned for `planned` bytes falls when `bytes` of it
// move (ragged_all_to_all: the plan is for the largest transfer, the operands say how much of it
// moves): the same fraction of `bytes`, rounded down to 64 bytes, the task's end staying its end.
// Every channel's element keeps its share, and both ends cut the same planned elements the same
// way.
JR_INLINE int64_t ScaledEdge(int64_t edge, int64_t planned, int64_t bytes) {
  if (planned <= 0 || edge >= planned) return ProgMin(bytes, ProgMax(planned, 0));
  const int64_t b = ProgMin(bytes, planned);
  return int64_t(MulDivFloor(uint64_t(edge), uint64_t(b), uint64_t(planned))) & ~int64_t(63);
}

// Primitives of a point-to-point element (at least one, so an empty transfer still meets its
// peer).
JR_INLINE int64_t P2pOpCount(const WorkElemP2p& e) {
  const int64_t bytes = int64_t((uint64_t(e.countHi) << 32) | e.countLo);
  return ProgMax(1, ProgDivUp(bytes, e.chunkSize));
}

// A primitive of `n` units moves in PieceCount pieces of PieceUnits units (the last may be
// shorter), each at most `stepCap` units: one FIFO step each.
JR_INLINE int64_t PieceCount(int64_t n, int64_t stepCap) {
  return ProgMax(1, ProgDivUp(n, stepCap));
}
JR_INLINE int64_t PieceUnits(int64_t n, int64_t nPieces) {
  return n > 0 ? ProgDivUp(n, nPieces) : 0;
}

}  // namespace jax_rccl
