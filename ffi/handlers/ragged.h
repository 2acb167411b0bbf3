// ragged_all_to_all over the point-to-point path, for every platform's handler.
//
// The call `jax_rccl_ragged_all_to_all` takes three operands (then at most one ordering operand):
//   operand[N, R]   the rows to send (R elements of any type per row),
//   output[M, R]    the rows the result starts from (the result aliases it),
//   table[n * 4K]   int32 or int64: every rank's (input_offsets, send_sizes, output_offsets,
//                   recv_sizes), K values each, gathered in rank order by the all_gather the
//                   lowering puts in front of the call,
// and returns result[M, R]. Slice i of rank s (K = spd * n slices, spd per peer) goes to rank
// i / spd, rows [input_offsets[i], +send_sizes[i]) of s's operand to rows [output_offsets[i],
// +send_sizes[i]) of that rank's result.
//
// The plan is built once from the shapes: per peer and slice one send and one receive of the
// largest transfer possible, min(N, M) rows. Each execution reads the table (a device array)
// and sets every transfer's buffers and byte count (SlotBuffers::bytes); both ends of a transfer
// read the same entry of the same table, so they agree on the bytes without another message.
// Every rank checks the whole table the same way, so a bad entry (a negative offset or size,
// a slice past the operand or the output, send_sizes that disagree with the receiver's
// recv_sizes) fails every rank's call with the same message before anything moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ffi/core/status.h"
#include "ffi/handlers/common.h"

namespace jax_rccl {

// The shapes of a ragged_all_to_all call.
struct RaggedShape {
  int64_t inRows = 0, outRows = 0;  // N, M
  int64_t rowBytes = 0;             // R elements' bytes
  int64_t slices = 0;               // K
  bool table64 = false;             // the table's entries are int64 (else int32)
};

// Reads and checks the operands and the result of a ragged_all_to_all call over a group of
// attrs.groupSize ranks; fills `shape` and the one leaf the handler plans with (int8 bytes).
Status ReadRaggedLeaves(const CallAttrs& attrs, const xla::ffi::RemainingArgs& args,
                        const xla::ffi::RemainingRets& rets, RaggedShape* shape, Leaves* leaves);

// The task list of rank `rank`: for every peer j and slice k (j-major) one send then one
// receive of min(N, M) rows' bytes (none when that is 0). Buffers are set per execution.
RankTasks MakeRaggedTasks(const CallAttrs& attrs, int rank, const RaggedShape& shape);

// One transfer of an execution: the byte offset into the operand (send) or the result (recv)
// and the bytes moved.
struct RaggedTransfer {
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Checks the whole table (identical on every rank) and returns rank `rank`'s transfers in the
// order of MakeRaggedTasks's tasks.
Status RaggedTransfers(const CallAttrs& attrs, int rank, const RaggedShape& shape,
                       const void* table, std::vector<RaggedTransfer>* out);

}  // namespace jax_rccl
