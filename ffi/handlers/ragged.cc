#include "ffi/handlers/ragged.h"

#include <algorithm>
#include <string>

namespace ffi = xla::ffi;

namespace jax_rccl {

Status ReadRaggedLeaves(const CallAttrs& attrs, const ffi::RemainingArgs& args,
                        const ffi::RemainingRets& rets, RaggedShape* shape, Leaves* leaves) {
  const std::string& who = attrs.name;
  const int64_t n = attrs.groupSize;
  JR_REQUIRE(rets.size() == 1 && (args.size() == 3 || args.size() == 4), Code::kInvalidArgument,
             "jax_rccl '", who, "' (ragged_all_to_all): ", args.size(), " operands and ",
             rets.size(),
             " results; expected operand, output, the offsets table (and at most one ordering "
             "operand) and one result");
  auto in = args.get<ffi::AnyBuffer>(0);
  auto base = args.get<ffi::AnyBuffer>(1);
  auto table = args.get<ffi::AnyBuffer>(2);
  auto out = rets.get<ffi::AnyBuffer>(0);
  JR_REQUIRE(in.has_value() && base.has_value() && table.has_value() && out.has_value(),
             Code::kInvalidArgument, "jax_rccl '", who,
             "': an operand or the result is not a buffer");
  JR_REQUIRE(in->dimensions().size() == 2 && base->dimensions().size() == 2 &&
                 (*out)->dimensions().size() == 2,
             Code::kInvalidArgument, "jax_rccl '", who,
             "': operand, output and result must be 2-D (rows, row elements)");
  JR_REQUIRE(
      in->element_type() == base->element_type() && base->element_type() == (*out)->element_type(),
      Code::kInvalidArgument, "jax_rccl '", who,
      "': operand, output and result must have one element type");
  JR_REQUIRE(in->dimensions()[1] == base->dimensions()[1] &&
                 base->dimensions()[0] == (*out)->dimensions()[0] &&
                 base->dimensions()[1] == (*out)->dimensions()[1],
             Code::kInvalidArgument, "jax_rccl '", who,
             "': operand [N, R], output [M, R] and result [M, R] disagree");
  const ffi::DataType tt = table->element_type();
  JR_REQUIRE(tt == ffi::DataType::S32 || tt == ffi::DataType::S64, Code::kInvalidArgument,
             "jax_rccl '", who, "': the offsets table must be int32 or int64");
  const int64_t entries = int64_t(table->element_count());
  JR_REQUIRE(table->dimensions().size() == 1 && entries > 0 && entries % (4 * n * n) == 0,
             Code::kInvalidArgument, "jax_rccl '", who, "': the offsets table has ", entries,
             " entries; it needs group size ", n, " x 4 x K, with K a positive multiple of ", n);
  shape->inRows = in->dimensions()[0];
  shape->outRows = base->dimensions()[0];
  shape->rowBytes = int64_t(in->dimensions()[1]) * int64_t(ffi::ByteWidth(in->element_type()));
  shape->slices = entries / (4 * n);
  shape->table64 = tt == ffi::DataType::S64;
  leaves->types = {DataType::kInt8};
  leaves->inBytes = {in->size_bytes()};
  leaves->outBytes = {(*out)->size_bytes()};
  return Status::Ok();
}

RankTasks MakeRaggedTasks(const CallAttrs& attrs, int rank, const RaggedShape& shape) {
  (void)rank;
  RankTasks rt;
  rt.zeroBefore.assign(1, 0);
  rt.zeroAfter.assign(1, 0);
  const int n = attrs.groupSize;
  const int64_t spd = shape.slices / n;
  const uint64_t most = uint64_t(std::min(shape.inRows, shape.outRows) * shape.rowBytes);
  if (most == 0) return rt;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < spd; ++k) {
      for (int dir = 0; dir < 2; ++dir) {
        TaskDesc t;
        t.coll = dir == 0 ? Coll::kSend : Coll::kRecv;
        t.count = most;
        t.dtype = DataType::kInt8;
        t.op = kSum;
        t.peer = j;
        rt.tasks.push_back(t);
        SlotSource src;
        src.send = dir == 0;
        src.recv = dir == 1;
        rt.sources.push_back(src);
      }
    }
  }
  return rt;
}

namespace {

const char* const kFields[4] = {"input_offsets", "send_sizes", "output_offsets", "recv_sizes"};

}  // namespace

Status RaggedTransfers(const CallAttrs& attrs, int rank, const RaggedShape& shape,
                       const void* table, std::vector<RaggedTransfer>* out) {
  const std::string& who = attrs.name;
  const int n = attrs.groupSize;
  const int64_t K = shape.slices, spd = K / n;
  const int64_t N = shape.inRows, M = shape.outRows;
  // entry(s, f, i): field f (kFields) of slice i on rank s.
  auto entry = [&](int s, int f, int64_t i) -> int64_t {
    const int64_t at = (int64_t(s) * 4 + f) * K + i;
    return shape.table64 ? static_cast<const int64_t*>(table)[at]
                         : int64_t(static_cast<const int32_t*>(table)[at]);
  };
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < K; ++i) {
      const int64_t inOff = entry(s, 0, i), size = entry(s, 1, i), outOff = entry(s, 2, i);
      const int64_t dst = i / spd, k = i % spd;
      for (int f = 0; f < 4; ++f) {
        JR_REQUIRE(entry(s, f, i) >= 0, Code::kInvalidArgument, "jax_rccl '", who,
                   "' (ragged_all_to_all): rank ", s, " has ", kFields[f], "[", i,
                   "] = ", entry(s, f, i), "; offsets and sizes must be >= 0");
      }
      JR_REQUIRE(inOff <= N && size <= N - inOff, Code::kInvalidArgument, "jax_rccl '", who,
                 "' (ragged_all_to_all): rank ", s, " sends rows [", inOff, ", ", inOff, " + ",
                 size, ") of its operand (input_offsets[", i, "] + send_sizes[", i, "]), past its ",
                 N, " rows");
      JR_REQUIRE(outOff <= M && size <= M - outOff, Code::kInvalidArgument, "jax_rccl '", who,
                 "' (ragged_all_to_all): rank ", s, " sends ", size, " rows to rows [", outOff,
                 ", ", outOff, " + ", size, ") of rank ", dst, "'s output (output_offsets[", i,
                 "] + send_sizes[", i, "]), past its ", M, " rows");
      const int64_t expect = entry(int(dst), 3, int64_t(s) * spd + k);
      JR_REQUIRE(size == expect, Code::kInvalidArgument, "jax_rccl '", who,
                 "' (ragged_all_to_all): rank ", s, " sends send_sizes[", i, "] = ", size,
                 " rows to rank ", dst, ", whose recv_sizes[", int64_t(s) * spd + k, "] = ", expect,
                 "; they must be equal (send_sizes == all_to_all(recv_sizes))");
    }
  }
  out->clear();
  if (std::min(N, M) * shape.rowBytes == 0) return Status::Ok();
  const int64_t rb = shape.rowBytes;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < spd; ++k) {
      const int64_t mine = int64_t(j) * spd + k;       // my slice to j
      const int64_t theirs = int64_t(rank) * spd + k;  // j's slice to me
      out->push_back({entry(rank, 0, mine) * rb, entry(rank, 1, mine) * rb});
      out->push_back({entry(j, 2, theirs) * rb, entry(j, 1, theirs) * rb});
    }
  }
  return Status::Ok();
}

}  // namespace jax_rccl
