// The FFI contract of every collective call, as the handler (ffi/handlers/collective.h) reads
// it: the collective kinds, the attributes and their validation, the leaves' shapes, the device
// check of an exported program, the task list a device plans with, and the one place a Status
// becomes an ffi::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ffi/core/params.h"
#include "ffi/core/status.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/types.h"
#include "xla/ffi/api/ffi.h"

namespace jax_rccl {

// Every collective kind, once: (its FFI target's name after "jax_rccl_", its Kind enumerator
// without the k). The enum, KindName and both platforms' instantiate handlers and target tables
// expand it.
#define JAX_RCCL_FFI_KINDS(X)        \
  X("all_reduce", AllReduce)         \
  X("all_gather", AllGather)         \
  X("reduce_scatter", ReduceScatter) \
  X("broadcast", Broadcast)          \
  X("reduce", Reduce)                \
  X("all_to_all", AllToAll)          \
  X("ppermute", Ppermute)            \
  X("ragged_all_to_all", RaggedAllToAll)

#define JAX_RCCL_KIND_ENUMERATOR(name, kind) k##kind,
enum class Kind : int { JAX_RCCL_FFI_KINDS(JAX_RCCL_KIND_ENUMERATOR) };
#undef JAX_RCCL_KIND_ENUMERATOR

const char* KindName(Kind k);
bool Reduces(Kind k);

// The one place a Status becomes an ffi::Error (timeout -> deadline exceeded, invalid argument
// or usage -> invalid argument, unsupported -> unimplemented, the rest internal).
xla::ffi::Error ToFfiError(const Status& s);

StatusOr<DataType> FromFfiType(xla::ffi::DataType t);

// The attributes of one call site (the FFI contract, docs/architecture.md), validated, with the
// parameters read at instantiate.
struct CallAttrs {
  Kind kind = Kind::kAllReduce;
  int32_t op = kSum;
  int premul = 0;
  double premulValue = 1.0;
  int root = 0;
  int groupSize = 1;  // the largest group's (all_reduce groups may be smaller: groups[g].size())
  std::vector<std::pair<int, int>> perm;     // (src, dst) ranks
  std::vector<std::vector<int64_t>> groups;  // device ids in rank order
  Tuning tuning;
  PlannerParams plannerParams;
  Params params;
  int64_t callSite = 0;
  std::string name;
  std::string protocolText;  // the `protocol` attribute as written
  int abiVersion = 1;        // the contract version the program was lowered with
};

// The versions of the contract this runtime runs. 1: the attributes below without `abi_version`
// (programs serialized before it existed); 2: the same with `abi_version` = 2. A program of a
// newer version fails at instantiate naming both versions.
inline constexpr int kAbiVersion = 2;
inline constexpr int kOldestAbiVersion = 1;

// The custom calls' attributes, each named once, with the type the dictionary holds it as:
// X(name, type). The lowering writes the same names (jax_rccl/lowering.py; tests/jax/
// test_export_abi.py compares them with call_attribute_names()), plus `abi_version` (optional).
#define JAX_RCCL_CALL_ATTRS(X)                     \
  X(replica_groups, xla::ffi::Span<const int64_t>) \
  X(group_size, int64_t)                           \
  X(op, int32_t)                                   \
  X(premul, int32_t)                               \
  X(premul_value, double)                          \
  X(root, int64_t)                                 \
  X(perm, xla::ffi::Span<const int64_t>)           \
  X(algorithm, std::string_view)                   \
  X(protocol, std::string_view)                    \
  X(call_site, int64_t)                            \
  X(name, std::string_view)

// The names of JAX_RCCL_CALL_ATTRS, in order, then "abi_version".
std::vector<std::string> CallAttributeNames();

// Reads every attribute of the contract from a call's dictionary (`abi_version` optional:
// absent means 1), then validates them as ParseCallAttrs does.
Status DecodeCallAttrs(Kind kind, const xla::ffi::Dictionary& attrs, CallAttrs* out);

// Validates the attributes into `out` (every error names the argument and the allowed values).
Status ParseCallAttrs(Kind kind, xla::ffi::Span<const int64_t> groups, int64_t groupSize,
                      int32_t op, int32_t premul, double premulValue, int64_t root,
                      xla::ffi::Span<const int64_t> perm, std::string_view algorithm,
                      std::string_view protocol, int64_t callSite, std::string_view name,
                      CallAttrs* out);

// The leaves of a call as planned: element type and byte sizes of operand and result.
struct Leaves {
  std::vector<DataType> types;
  std::vector<size_t> inBytes, outBytes;
  size_t size() const { return types.size(); }
};

// Reads and checks the leaves of a first call: operand count (the leaves, one premul scalar per
// leaf when premul == 2, then at most a device check and an ordering operand), element types, and
// the element counts each kind needs over a group of attrs.groupSize.
Status ReadLeaves(const CallAttrs& attrs, const xla::ffi::RemainingArgs& args,
                  const xla::ffi::RemainingRets& rets, Leaves* leaves);

// A program lowered for jax.export holds the physical devices of its mesh in its replica groups,
// and may be called later with the same devices in another mesh order. Its calls then take one
// more operand after the leaves and premul scalars: three int64s {kDeviceCheckMagic, the partition
// id, the device id the lowering placed at that partition}. The index of that operand in `args`,
// or -1 when the call has none (an ordering operand has one element, never three).
constexpr int64_t kDeviceCheckMagic = 0x6a72636364657631;  // "jrccdev1"
int DeviceCheckOperand(const CallAttrs& attrs, const xla::ffi::RemainingArgs& args, size_t nLeaves);

// OK when the call has no device check or `device` is the device its partition was lowered for;
// else an error naming the partition and both devices. The operand must be in host memory.
Status CheckDevice(const CallAttrs& attrs, const xla::ffi::RemainingArgs& args, size_t nLeaves,
                   int64_t device);
// The same check of the operand's three values `v` (read from operand `at` wherever it lives).
Status CheckDeviceValues(const CallAttrs& attrs, const int64_t v[3], int at, int64_t device);

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
// rank with TRACE), ending with the topology's node count. `where` follows the name ("" or
// " (GPU)").
void LogPlan(const CallAttrs& attrs, int rank, const Plan& plan, int nNodes, const char* where);

}  // namespace jax_rccl
