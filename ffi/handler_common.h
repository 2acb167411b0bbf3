// What the CPU and GPU FFI handlers share (ffi/cpu/handlers.cc, ffi/gpu/handlers.cc): the
// collective kinds, the attributes of the FFI contract and their validation, the leaves' shapes,
// the task list a device plans with, and the one place a Status becomes an ffi::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ffi/params.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/status.h"
#include "ffi/planner/types.h"
#include "xla/ffi/api/ffi.h"

namespace jax_rccl {

enum class Kind : int {
  kAllReduce = 0,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kPpermute,
};

const char* KindName(Kind k);
bool Reduces(Kind k);

// The one place a Status becomes an ffi::Error (timeout -> deadline exceeded, invalid argument
// or usage -> invalid argument, unsupported -> unimplemented, the rest internal).
xla::ffi::Error ToFfiError(const Status& s);

StatusOr<DataType> FromFfiType(xla::ffi::DataType t);

// The bytes of `value` in `dtype` (the immediate PreMulSum scalar).
uint64_t ScalarBits(double value, DataType dtype);

// The attributes of one call site (the FFI contract, docs/architecture.md), validated, with the
// parameters read at instantiate.
struct CallAttrs {
  Kind kind = Kind::kAllReduce;
  int32_t op = kSum;
  int premul = 0;
  double premulValue = 1.0;
  int root = 0;
  int groupSize = 1;
  std::vector<std::pair<int, int>> perm;     // (src, dst) ranks
  std::vector<std::vector<int64_t>> groups;  // device ids in rank order
  Tuning tuning;
  PlannerParams plannerParams;
  Params params;
  int64_t callSite = 0;
  std::string name;
};

// Validates the attributes into `out` (every error names the argument and the allowed values).
Status ParseCallAttrs(Kind kind, xla::ffi::Span<const int64_t> groups, int64_t groupSize,
                      int32_t op, int32_t premul, double premulValue, int64_t root,
                      xla::ffi::Span<const int64_t> perm, std::string_view algorithm,
                      std::string_view protocol, int64_t callSite, std::string_view name,
                      CallAttrs* out);

// The instantiate binding of every target (the attributes in the contract's order).
inline auto InstantiateAttrs() {
  return xla::ffi::Ffi::BindInstantiate()
      .Attr<xla::ffi::Span<const int64_t>>("replica_groups")
      .Attr<int64_t>("group_size")
      .Attr<int32_t>("op")
      .Attr<int32_t>("premul")
      .Attr<double>("premul_value")
      .Attr<int64_t>("root")
      .Attr<xla::ffi::Span<const int64_t>>("perm")
      .Attr<std::string_view>("algorithm")
      .Attr<std::string_view>("protocol")
      .Attr<int64_t>("call_site")
      .Attr<std::string_view>("name");
}

// The leaves of a call as planned: element type and byte sizes of operand and result.
struct Leaves {
  std::vector<DataType> types;
  std::vector<size_t> inBytes, outBytes;
  size_t size() const { return types.size(); }
};

// Reads and checks the leaves of a first call: operand count (the leaves, one premul scalar per
// leaf when premul == 2, then at most one ordering operand), element types, and the element
// counts each kind needs over a group of attrs.groupSize.
Status ReadLeaves(const CallAttrs& attrs, const xla::ffi::RemainingArgs& args,
                  const xla::ffi::RemainingRets& rets, Leaves* leaves);

// Where a task slot's buffers come from: byte offsets into a leaf's operand and result.
struct SlotSource {
  int leaf = 0;
  bool send = false;  // SlotBuffers::send = operand(leaf) + sendOffset
  bool recv = false;  // SlotBuffers::recv = result(leaf) + recvOffset
  size_t sendOffset = 0;
  size_t recvOffset = 0;
};

// The task list of rank `rank`, with per task its buffers' sources, and per leaf whether the
// rank zeroes its output before (a ppermute rank no one sends to) or after (reduce: not the
// root) the collective. `oneRankCopies`: on a group of one rank, data movement to itself
// (all_to_all, ppermute (0, 0)) is planned as a broadcast (a copy in the one-rank plan).
struct RankTasks {
  std::vector<TaskDesc> tasks;
  std::vector<SlotSource> sources;             // by task
  std::vector<uint8_t> zeroBefore, zeroAfter;  // by leaf
};
RankTasks MakeRankTasks(const CallAttrs& attrs, int rank, const Leaves& leaves, bool oneRankCopies);

// JAX_RCCL_DEBUG=INFO: one line per task of a plan built (rank 0 only, as NCCL's INFO; every
// rank with TRACE). `where` follows the name ("" or " (GPU)").
void LogPlan(const CallAttrs& attrs, int rank, const Plan& plan, const char* where);

}  // namespace jax_rccl
