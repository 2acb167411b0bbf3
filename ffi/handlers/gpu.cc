// The GPU runtime's XLA FFI handlers (platforms CUDA and ROCM; one source for both).
//
// The same seven targets and attributes as the CPU handlers (ffi/handlers/cpu.cc); the execute
// stage is one handler for all kinds, the kind lives in the state.
//
// instantiate (once per call site per executable, at compile time, with no device: ordinal -1):
//   validates the attributes, reads the parameters, creates the state: one slot per device of
//   the replica groups, each with its rank.
// execute (each call on each device, on XLA's stream; possibly while XLA records a command
//   buffer, possibly NOT on every call when the command buffer is replayed): maps the device
//   ordinal to its global id and slot; at the slot's first execute builds its plan, joins the
//   group's communicator (ffi/gpu/comm.h: one rendezvous per communicator) and uploads the plan
//   to the device. Every execute after that: reads the rank's status word (no sync), fills the
//   task slots with this call's buffer pointers and launches the plan on XLA's stream. No host
//   synchronization, no allocation, no upload.
//
// PreMulSum with a per-device scalar operand (premul == 2): the scalar lives in device memory
// whose value (and possibly address) changes from call to call. The plan's user op is made with
// ScalarResidence::kDevice over a host cell of the slot (its address only names the op; nothing
// reads it); each execute passes the operand's device address in the task's SlotPtrs::scalar, and
// the kernel reads the value when it runs, so a launch captured into a command buffer reads every
// replay's scalar (a new operand address makes XLA update the recorded launch).
#include "ffi/handlers/gpu.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ffi/comm/comm.h"
#include "ffi/core/params.h"
#include "ffi/core/stats.h"
#include "ffi/core/status.h"
#include "ffi/gpu/comm.h"
#include "ffi/gpu/device_ctl.h"
#include "ffi/handlers/common.h"
#include "ffi/handlers/ragged.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/redop.h"
#include "ffi/planner/types.h"
#include "hip/runtime.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_rccl {
namespace gpu {
namespace {

// One device's part of the state.
struct DeviceSlot {
  int64_t device = 0;
  int ordinal = -1;
  int group = 0;
  int rank = 0;

  std::mutex mu;  // guards the build
  std::atomic<bool> built{false};
  Status buildError;  // sticky: the shapes of an executable do not change
  GpuComm* comm = nullptr;
  RedOpTable userOps;
  std::unique_ptr<DevicePlan> devPlan;  // null: nothing moves on this rank
  std::vector<SlotSource> sources;      // by task slot
  Leaves leaves;                        // as planned
  std::vector<uint8_t> zeroBefore, zeroAfter;

  std::mutex launchMu;                      // guards `scratch` (one launch of this slot at a time)
  std::vector<SlotPtrs> scratch;            // by task slot; sized at build (no allocation per call)
  std::vector<void*> inPtr, outPtr;         // by leaf; sized at build
  std::vector<const void*> scalarPtr;       // by leaf (premul == 2); sized at build
  std::unique_ptr<uint64_t[]> scalarCells;  // premul == 2: one per leaf, names its user op
  RaggedShape ragged;                       // ragged_all_to_all only
};

constexpr int kMaxOrdinals = 64;

}  // namespace

// The state of one call site in one executable (shared by its devices).
struct GpuState : CallAttrs {
  static ffi::TypeId id;
  std::unordered_map<int64_t, std::unique_ptr<DeviceSlot>> slots;  // by global id; fixed
  // The slot of a device ordinal, cached at its first execute (null: not looked up yet).
  std::atomic<DeviceSlot*> byOrdinal[kMaxOrdinals] = {};
};

ffi::TypeId GpuState::id = {};

namespace {

StatusOr<std::unique_ptr<GpuState>> MakeState(Kind kind, ffi::Span<const int64_t> groups,
                                              int64_t groupSize, int32_t op, int32_t premul,
                                              double premulValue, int64_t root,
                                              ffi::Span<const int64_t> perm,
                                              std::string_view algorithm, std::string_view protocol,
                                              int64_t callSite, std::string_view name) {
  auto st = std::make_unique<GpuState>();
  JR_CHECK(ParseCallAttrs(kind, groups, groupSize, op, premul, premulValue, root, perm, algorithm,
                          protocol, callSite, name, st.get()));
  // LL128 runs only where a protocol setting (the call's, else JAX_RCCL_PROTO) is given: the
  // planner's own choice stays on LL and Simple until LL128's figures are in docs/benchmarks.md.
  if (protocol.empty() && st->params.proto.empty()) {
    st->tuning.protoMask &= ~(1u << static_cast<int>(Proto::kLL128));
  }
  for (size_t g = 0; g < st->groups.size(); ++g) {
    for (int r = 0; r < static_cast<int>(st->groups[g].size()); ++r) {
      auto slot = std::make_unique<DeviceSlot>();
      slot->device = st->groups[g][size_t(r)];
      slot->group = static_cast<int>(g);
      slot->rank = r;
      st->slots.emplace(slot->device, std::move(slot));
    }
  }
  return st;
}

// Builds `slot`'s plan from the shapes of its first call, joins its communicator and uploads
// the plan to the slot's device.
Status BuildPlan(const GpuState& st, DeviceSlot& slot, const ffi::RemainingArgs& args,
                 const ffi::RemainingRets& rets) {
  const std::string& who = st.name;
  // The device check of an exported program lives in device memory here, where the execute
  // stage cannot read it (XLA may capture the launch in a command buffer).
  JR_REQUIRE(DeviceCheckOperand(st, args, rets.size()) < 0, Code::kUnsupported, "jax_rccl '",
             st.name, "' (", KindName(st.kind),
             "): a program exported with jax.export runs on the CPU runtime only; on GPUs its "
             "device order cannot be checked yet: lower the program where it runs instead");
  const bool ragged = st.kind == Kind::kRaggedAllToAll;
  JR_CHECK(ragged ? ReadRaggedLeaves(st, args, rets, &slot.ragged, &slot.leaves)
                  : ReadLeaves(st, args, rets, &slot.leaves));
  const size_t nLeaves = slot.leaves.size();
  JR_ASSIGN_OR_RETURN(slot.comm, GetOrCreateComm(st.groups[slot.group], st.params, who));

  slot.inPtr.assign(nLeaves, nullptr);
  slot.outPtr.assign(nLeaves, nullptr);
  slot.scalarPtr.assign(nLeaves, nullptr);

  RankTasks rt = ragged ? MakeRaggedTasks(st, slot.rank, slot.ragged)
                        : MakeRankTasks(st, slot.rank, slot.leaves, /*oneRankCopies=*/true);
  std::vector<TaskDesc>& tasks = rt.tasks;
  slot.sources = std::move(rt.sources);
  slot.zeroBefore = std::move(rt.zeroBefore);
  slot.zeroAfter = std::move(rt.zeroAfter);
  if (st.premul != 0) {
    if (st.premul == 2) slot.scalarCells = std::make_unique<uint64_t[]>(nLeaves);
    for (TaskDesc& t : tasks) {
      if (t.coll != Coll::kAllReduce && t.coll != Coll::kReduceScatter && t.coll != Coll::kReduce) {
        continue;
      }
      if (st.premul == 1) {
        const uint64_t bits = ScalarBits(st.premulValue, t.dtype);
        JR_ASSIGN_OR_RETURN(
            t.op, slot.userOps.CreatePreMulSum(&bits, t.dtype, ScalarResidence::kHostImmediate));
      } else {
        const size_t leaf = slot.sources[size_t(&t - tasks.data())].leaf;
        JR_ASSIGN_OR_RETURN(t.op, slot.userOps.CreatePreMulSum(&slot.scalarCells[leaf], t.dtype,
                                                               ScalarResidence::kDevice));
      }
    }
  }
  slot.scratch.assign(tasks.size(), SlotPtrs{nullptr, nullptr, nullptr});

  // Every rank joins, even one that moves nothing: the others' launches need its region.
  JR_CHECK(slot.comm->Join(slot.rank, who));
  if (tasks.empty()) {
    Stats().plansBuilt.fetch_add(1);
    return Status::Ok();
  }

  PlanRequest req;
  req.topo = slot.comm->topo();
  req.rank = slot.rank;
  req.tasks = std::move(tasks);
  req.tuning = st.tuning;
  req.params = st.plannerParams;
  req.userOps = &slot.userOps;
  req.persistent = true;
  JR_ASSIGN_OR_RETURN(Plan plan, MakePlan(req));
  RaggedPlan raggedPlan;
  if (ragged) {
    // Task 2 (j spd + k) sends this rank's slice j spd + k to rank j; the next receives rank j's
    // slice rank spd + k (MakeRaggedTasks's order).
    const int n = st.groupSize;
    const int64_t spd = slot.ragged.slices / n;
    raggedPlan.dims = RaggedDims{slot.ragged.inRows, slot.ragged.outRows, slot.ragged.rowBytes,
                                 int32_t(slot.ragged.slices), slot.ragged.table64 ? 1 : 0};
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const int64_t pair = int64_t(t / 2), j = pair / spd, k = pair % spd;
      raggedPlan.entries.push_back(t % 2 == 0 ? RaggedEntry(slot.rank, j * spd + k)
                                              : RaggedEntry(int(j), slot.rank * spd + k));
    }
  }
  if (st.params.debug == "INFO" || st.params.debug == "TRACE")
    LogPlan(st, slot.rank, plan, " (GPU)");
  {
    RelaxedCapture relaxed;
    DeviceGuard guard(slot.ordinal);
    JR_CHECK(guard.status());
    StatusOr<std::unique_ptr<DevicePlan>> dp =
        DevicePlan::Upload(plan, slot.comm->geo(), ragged ? &raggedPlan : nullptr);
    if (!dp.ok()) {
      Status s = dp.status();
      JR_STATUS_FRAME_(s);
      return Status(s.code(),
                    detail::StrCat("jax_rccl '", who, "' (", KindName(st.kind), ") on GPU group ",
                                   slot.comm->groupText(), ": ", s.ToString()));
    }
    slot.devPlan = dp.take();
  }
  Stats().plansBuilt.fetch_add(1);
  return Status::Ok();
}

std::string GroupsText(const GpuState& st) {
  std::string all;
  for (const auto& g : st.groups) {
    all += "[";
    for (size_t i = 0; i < g.size(); ++i) all += (i ? ", " : "") + std::to_string(g[i]);
    all += "]";
  }
  return all;
}

// The slot of `ordinal` (cached after the first lookup).
StatusOr<DeviceSlot*> SlotOf(GpuState& st, int ordinal) {
  JR_REQUIRE(ordinal >= 0 && ordinal < kMaxOrdinals, Code::kInternal, "jax_rccl '", st.name,
             "': device ordinal ", ordinal, " is outside 0..", kMaxOrdinals - 1);
  DeviceSlot* cached = st.byOrdinal[ordinal].load(std::memory_order_acquire);
  if (cached != nullptr) return cached;
  JR_ASSIGN_OR_RETURN(int64_t device, GlobalIdOfOrdinal(ordinal));
  auto it = st.slots.find(device);
  JR_REQUIRE(it != st.slots.end(), Code::kInvalidArgument, "jax_rccl '", st.name, "': device ",
             device, " (GPU ordinal ", ordinal, ") is in none of the replica groups ",
             GroupsText(st));
  it->second->ordinal = ordinal;
  st.byOrdinal[ordinal].store(it->second.get(), std::memory_order_release);
  return it->second.get();
}

Status Execute(GpuState& st, void* stream, int ordinal, const ffi::RemainingArgs& args,
               const ffi::RemainingRets& rets) {
  JR_ASSIGN_OR_RETURN(DeviceSlot * slotPtr, SlotOf(st, ordinal));
  DeviceSlot& slot = *slotPtr;
  if (!slot.built.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (!slot.built.load(std::memory_order_relaxed)) {
      slot.buildError = BuildPlan(st, slot, args, rets);
      // Let the group's other ranks fail at once instead of at their deadline (their kernels
      // would wait for this rank's data).
      if (!slot.buildError.ok() && slot.comm != nullptr && slot.comm->nRanks() > 1) {
        (void)slot.comm->Fail(slot.buildError);
      }
      slot.built.store(true, std::memory_order_release);
    }
  }
  if (!slot.buildError.ok()) {
    Status s = slot.buildError;
    JR_STATUS_FRAME_(s);
    return s;
  }
  Stats().executions.fetch_add(1, std::memory_order_relaxed);

  const size_t nLeaves = slot.leaves.size();
  JR_REQUIRE(rets.size() == nLeaves, Code::kInvalidArgument, "jax_rccl '", st.name,
             "': called with ", rets.size(), " results; the plan has ", nLeaves);
  JR_CHECK(slot.comm->Check(slot.rank, st.name));
  JR_CHECK(EnsureDevice(ordinal));

  std::lock_guard<std::mutex> lock(slot.launchMu);
  for (size_t i = 0; i < nLeaves; ++i) {
    auto a = args.get<ffi::AnyBuffer>(i);
    auto b = rets.get<ffi::AnyBuffer>(i);
    JR_REQUIRE(a.has_value() && b.has_value() && a->size_bytes() == slot.leaves.inBytes[i] &&
                   (*b)->size_bytes() == slot.leaves.outBytes[i],
               Code::kInvalidArgument, "jax_rccl '", st.name, "': leaf ", i,
               " changed shape since the plan was built");
    slot.inPtr[i] = a->untyped_data();
    slot.outPtr[i] = (*b)->untyped_data();
    if (st.premul == 2) {
      auto sc = args.get<ffi::AnyBuffer>(nLeaves + i);
      JR_REQUIRE(sc.has_value() && sc->size_bytes() >= DataTypeSize(slot.leaves.types[i]),
                 Code::kInvalidArgument, "jax_rccl '", st.name, "': premul operand ", nLeaves + i,
                 " is not a scalar of leaf ", i, "'s element type");
      slot.scalarPtr[i] = sc->untyped_data();
    }
    if (slot.zeroBefore[i]) {
      JR_CHECK(MemsetAsync(slot.outPtr[i], static_cast<int64_t>(slot.leaves.outBytes[i]), stream));
    }
  }
  const void* table = nullptr;
  if (st.kind == Kind::kRaggedAllToAll) {
    // The result starts as `output` (XLA aliases them; a copy where it did not), and the kernels
    // read the offsets table when they run.
    auto base = args.get<ffi::AnyBuffer>(1);
    auto tab = args.get<ffi::AnyBuffer>(2);
    JR_REQUIRE(base.has_value() && tab.has_value(), Code::kInvalidArgument, "jax_rccl '", st.name,
               "': output or offsets table is not a buffer");
    JR_CHECK(CopyAsync(slot.outPtr[0], base->untyped_data(), int64_t(base->size_bytes()), stream));
    table = tab->untyped_data();
  }
  if (slot.devPlan) {
    for (size_t t = 0; t < slot.sources.size(); ++t) {
      const SlotSource& s = slot.sources[t];
      slot.scratch[t].send =
          s.send ? static_cast<const char*>(slot.inPtr[s.leaf]) + s.sendOffset : nullptr;
      slot.scratch[t].recv =
          s.recv ? static_cast<char*>(slot.outPtr[s.leaf]) + s.recvOffset : nullptr;
      slot.scratch[t].scalar = slot.scalarPtr[s.leaf];
      if (table != nullptr) slot.scratch[t].table = table;
    }
    Status launched = slot.devPlan->Launch(slot.comm->Launch(slot.rank, stream), slot.scratch);
    if (!launched.ok()) {
      JR_STATUS_FRAME_(launched);
      return Status(launched.code(), detail::StrCat("jax_rccl '", st.name, "' (", KindName(st.kind),
                                                    ") on GPU group ", slot.comm->groupText(), ": ",
                                                    launched.ToString()));
    }
  }
  for (size_t i = 0; i < nLeaves; ++i) {
    if (slot.zeroAfter[i]) {
      JR_CHECK(MemsetAsync(slot.outPtr[i], static_cast<int64_t>(slot.leaves.outBytes[i]), stream));
    }
  }
  return Status::Ok();
}

// ---- The FFI entry points ----

template <Kind K>
ffi::ErrorOr<std::unique_ptr<GpuState>> InstantiateFor(
    ffi::Span<const int64_t> groups, int64_t groupSize, int32_t op, int32_t premul,
    double premulValue, int64_t root, ffi::Span<const int64_t> perm, std::string_view algorithm,
    std::string_view protocol, int64_t callSite, std::string_view name) {
  return GuardInstantiate<GpuState>("jax_rccl GPU instantiate", [&] {
    StatusOr<std::unique_ptr<GpuState>> st =
        MakeState(K, groups, groupSize, op, premul, premulValue, root, perm, algorithm, protocol,
                  callSite, name);
    if (st.ok()) Stats().instantiations.fetch_add(1);
    return st;
  });
}

ffi::Error ExecuteEntry(void* stream, int32_t ordinal, GpuState* st, ffi::RemainingArgs args,
                        ffi::RemainingRets rets) {
  if (st == nullptr) {
    return ffi::Error::Internal("jax_rccl GPU execute: no state (not instantiated)");
  }
  return GuardExecute("jax_rccl GPU execute", &Stats().errors,
                      [&] { return Execute(*st, stream, ordinal, args, rets); });
}

}  // namespace
}  // namespace gpu
}  // namespace jax_rccl

// One execute handler for every target (the kind lives in the state), safe to capture into a
// command buffer: every call launches the same kernels with the same arguments but the buffers.
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_rccl_gpu_execute, jax_rccl::gpu::ExecuteEntry,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<void*>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Ctx<xla::ffi::State<jax_rccl::gpu::GpuState>>()
                                  .RemainingArgs()
                                  .RemainingRets(),
                              {xla::ffi::Traits::kCmdBufferCompatible});

#define JAX_RCCL_GPU_INSTANTIATE(name, kind)                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_rccl_gpu_instantiate_##kind,                        \
                                jax_rccl::gpu::InstantiateFor<jax_rccl::Kind::k##kind>, \
                                jax_rccl::InstantiateAttrs());
JAX_RCCL_FFI_KINDS(JAX_RCCL_GPU_INSTANTIATE)
#undef JAX_RCCL_GPU_INSTANTIATE

namespace jax_rccl {
namespace gpu {

const std::vector<cpu::FfiTarget>& GpuFfiTargets() {
  static const std::vector<cpu::FfiTarget> targets = {
#define JAX_RCCL_GPU_TARGET(name, kind)                                        \
  {"jax_rccl_" name, reinterpret_cast<void*>(jax_rccl_gpu_instantiate_##kind), \
   reinterpret_cast<void*>(jax_rccl_gpu_execute)},
      JAX_RCCL_FFI_KINDS(JAX_RCCL_GPU_TARGET)
#undef JAX_RCCL_GPU_TARGET
  };
  return targets;
}

void* GpuStateTypeId() {
  return &GpuState::id;
}

void* GpuStateTypeInfo() {
  static XLA_FFI_TypeInfo info = ffi::MakeTypeInfo<GpuState>();
  return &info;
}

}  // namespace gpu
}  // namespace jax_rccl
