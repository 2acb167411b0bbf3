// The GPU runtime's XLA FFI handlers (platforms CUDA and ROCM; one source for both): the
// collective handler (ffi/handlers/collective.h) over the GPU backend.
//
// instantiate runs at compile time, with no device (ordinal -1); the LL128 protocol is left out
// of the planner's choice unless a protocol setting names it.
// execute runs on XLA's stream; possibly while XLA records a command buffer, possibly NOT on
// every call when the command buffer is replayed. The slot of a device ordinal is found through
// its global id (cached per ordinal). The build rejects an exported program's device check (it
// lives in device memory, which execute cannot read), finds the group's communicator
// (ffi/gpu/comm.h), joins it (one rendezvous per communicator; every rank joins, even one that
// moves nothing: the others' launches need its region) and uploads the plan to the device under
// a relaxed capture mode. A rank whose build failed marks the communicator failed, so the other
// ranks' kernels stop instead of waiting for its data. Every call after that: reads the rank's
// status word (no sync), fills the slot's preallocated task slots with this call's buffer
// pointers and launches the plan on XLA's stream. No host synchronization, no upload, no
// allocation (up to 64 leaves).
//
// PreMulSum with a per-device scalar operand (premul == 2): the scalar lives in device memory
// whose value (and possibly address) changes from call to call. Its user op is made over a host
// cell of the slot (its address only names the op; nothing reads it); each execute passes the
// operand's device address in the task's SlotPtrs::scalar, and the kernel reads the value when
// it runs, so a launch captured into a command buffer reads every replay's scalar (a new operand
// address makes XLA update the recorded launch).
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ffi/comm/group.h"
#include "ffi/core/params.h"
#include "ffi/core/status.h"
#include "ffi/gpu/comm.h"
#include "ffi/gpu/device_ctl.h"
#include "ffi/handlers/collective.h"
#include "ffi/handlers/common.h"
#include "ffi/handlers/ragged.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/types.h"
#include "hip/hip_check.h"
#include "hip/runtime.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_rccl {
namespace gpu {
namespace {

// One device's part of the state.
struct DeviceSlot : SlotBase {
  int ordinal = -1;
  GpuComm* comm = nullptr;
  std::unique_ptr<DevicePlan> devPlan;  // null: nothing moves on this rank
  uint64_t callId = 0;  // the call's identity: call site mixed with the plan's fingerprint

  std::mutex launchMu;            // one call of this slot at a time (guards `scratch`)
  std::vector<SlotPtrs> scratch;  // by task slot; sized at build (no allocation per call)
};

constexpr int kMaxOrdinals = 64;

}  // namespace

struct GpuState : CollectiveState<DeviceSlot> {
  static ffi::TypeId id;
  // The slot of a device ordinal, cached at its first execute (null: not looked up yet).
  std::atomic<DeviceSlot*> byOrdinal[kMaxOrdinals] = {};
};

ffi::TypeId GpuState::id = {};

namespace {

// `s` from the device side of a call, naming the call and its GPU group.
Status OnGroup(const GpuState& st, const DeviceSlot& slot, Status s) {
  JR_STATUS_FRAME_(s);
  return Status(s.code(),
                detail::StrCat("jax_rccl '", st.name, "' (", KindName(st.kind), ") on GPU group ",
                               slot.comm->groupText(), ": ", s.ToString()));
}

struct GpuBackend {
  using State = GpuState;
  using Slot = DeviceSlot;
  struct Call {
    void* stream;
    int ordinal;
  };
  static constexpr const char* kStateTypeName = "jax_rccl_gpu_state";
  static constexpr const char* kInstantiateWho = "jax_rccl GPU instantiate";
  static constexpr const char* kExecuteWho = "jax_rccl GPU execute";
  static constexpr bool kOneRankCopies = true;

  static ffi::Error Entry(void* stream, int32_t ordinal, State* st, ffi::RemainingArgs args,
                          ffi::RemainingRets rets) {
    return Collective<GpuBackend>::Execute(st, Call{stream, ordinal}, args, rets);
  }
  // Safe to capture into a command buffer: every call launches the same kernels with the same
  // arguments but the buffers.
  static auto ExecuteHandler() {
    return ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<void*>>()
        .Ctx<ffi::DeviceOrdinal>()
        .Ctx<ffi::State<State>>()
        .RemainingArgs()
        .RemainingRets()
        .To(Entry, {ffi::Traits::kCmdBufferCompatible});
  }

  // LL128 runs only where a protocol setting (the call's, else JAX_RCCL_PROTO) is given: the
  // planner's own choice stays on LL and Simple until LL128's figures are in docs/benchmarks.md.
  static void Configure(State& st, std::string_view protocol) {
    if (protocol.empty() && st.params.proto.empty()) {
      st.tuning.protoMask &= ~(1u << static_cast<int>(Proto::kLL128));
    }
  }

  static StatusOr<Slot*> SlotOf(State& st, const Call& call) {
    const int ordinal = call.ordinal;
    JR_REQUIRE(ordinal >= 0 && ordinal < kMaxOrdinals, Code::kInternal, "jax_rccl '", st.name,
               "': device ordinal ", ordinal, " is outside 0..", kMaxOrdinals - 1);
    DeviceSlot* cached = st.byOrdinal[ordinal].load(std::memory_order_acquire);
    if (cached != nullptr) return cached;
    JR_ASSIGN_OR_RETURN(int64_t device, GlobalIdOfOrdinal(ordinal));
    auto it = st.slots.find(device);
    if (it == st.slots.end()) {
      return NotInGroups(st, device, detail::StrCat(" (GPU ordinal ", ordinal, ")"));
    }
    it->second->ordinal = ordinal;
    st.byOrdinal[ordinal].store(it->second.get(), std::memory_order_release);
    return it->second.get();
  }

  // The device check of an exported program (DeviceCheckOperand) lives in device memory here. The
  // host reads it once, at the slot's first call, when it can wait for the stream (the value is
  // fixed per executable and device, so later calls need no check). A first call that XLA records
  // into a command buffer has nothing to read yet: the kernels then compare it at every launch
  // instead (hip/kernel_check.h: DeviceOrderOk), before they move anything.
  static Status CheckOperands(const State& st, Slot& slot, const Call& call,
                              const ffi::RemainingArgs& args, const ffi::RemainingRets& rets) {
    const int at = DeviceCheckOperand(st, args, rets.size());
    if (at < 0) return Status::Ok();
    JR_ASSIGN_OR_RETURN(int64_t device, GlobalIdOfOrdinal(call.ordinal));
    auto stream = static_cast<hipStream_t>(call.stream);
    hipStreamCaptureStatus capture = hipStreamCaptureStatusNone;
    JR_HIP_CHECK(hipStreamIsCapturing(stream, &capture));
    if (capture != hipStreamCaptureStatusNone) {
      slot.deviceCheckAt = at;
      return Status::Ok();
    }
    int64_t v[3] = {0, 0, 0};
    DeviceGuard guard(call.ordinal);
    JR_CHECK(guard.status());
    JR_HIP_CHECK(hipMemcpyAsync(v, args.get<ffi::AnyBuffer>(at)->untyped_data(), sizeof(v),
                                hipMemcpyDeviceToHost, stream));
    JR_HIP_CHECK(hipStreamSynchronize(stream));
    return CheckDeviceValues(st, v, at, device);
  }

  static Status Connect(const State& st, Slot& slot) {
    JR_ASSIGN_OR_RETURN(slot.comm, GetOrCreateComm(st.groups[slot.group], st.params, st.name));
    return Status::Ok();
  }

  static Status BuildPlan(const State& st, Slot& slot, std::vector<TaskDesc> tasks) {
    slot.scratch.assign(tasks.size(), SlotPtrs{nullptr, nullptr, nullptr});
    // Every rank joins, even one that moves nothing: the others' launches need its region.
    JR_CHECK(slot.comm->Join(slot.rank, st.name));
    // The call's identity, as the CPU's (ffi/cpu/comm.cc), which its steps carry (mixed with its
    // number on the communicator, counted on the device: hip/kernel_check.h).
    const uint64_t site = static_cast<uint64_t>(st.callSite);
    if (tasks.empty()) {
      slot.callId = comm::HashMix(site, comm::HashMix(0, static_cast<uint64_t>(st.kind)));
      slot.comm->NoteCall(slot.callId, st.name, "nothing on this rank");
      return Status::Ok();
    }
    JR_ASSIGN_OR_RETURN(Plan plan,
                        PlanSlot(st, slot, slot.comm->topo(), std::move(tasks), " (GPU)"));
    {
      comm::CallFingerprint fp = comm::FingerprintPlan(plan, static_cast<uint64_t>(st.kind));
      slot.callId = comm::HashMix(site, fp.coll);
      slot.comm->NoteCall(slot.callId, st.name,
                          fp.text.size() > 96 ? fp.text.substr(0, 93) + "..." : fp.text);
    }
    if (slot.comm->crossHost()) {
      // Direct reads and writes the peers' buffers in place: every rank must be on one host.
      for (const TaskPlan& tp : plan.tasks) {
        if (tp.algo != Algo::kDirect) continue;
        return OnGroup(st, slot,
                       Status(Code::kUnsupported,
                              "algorithm Direct reads the peers' buffers in place, and this group "
                              "spans hosts (allowed there: Ring, Tree)"));
      }
    }
    RaggedPlan raggedPlan;
    const bool ragged = st.kind == Kind::kRaggedAllToAll;
    if (ragged) {
      // Task 2 (j spd + k) sends this rank's slice j spd + k to rank j; the next receives rank
      // j's slice rank spd + k (MakeRaggedTasks's order).
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
    RelaxedCapture relaxed;
    DeviceGuard guard(slot.ordinal);
    JR_CHECK(guard.status());
    StatusOr<std::unique_ptr<DevicePlan>> dp =
        DevicePlan::Upload(plan, slot.comm->geo(), ragged ? &raggedPlan : nullptr);
    if (!dp.ok()) return OnGroup(st, slot, dp.status());
    slot.devPlan = dp.take();
    return Status::Ok();
  }

  // Lets the group's other ranks fail at once instead of at their deadline (their kernels would
  // wait for this rank's data); the communicator keeps the first failure.
  static void OnFailedCall(const State&, Slot& slot, const Call&) {
    if (slot.comm != nullptr && slot.comm->nRanks() > 1) (void)slot.comm->Fail(slot.buildError);
  }

  static Status BeginCall(const State& st, Slot& slot, const Call& call) {
    JR_CHECK(slot.comm->Check(slot.rank, st.name));
    return EnsureDevice(call.ordinal);
  }
  static std::unique_lock<std::mutex> LockCall(Slot& slot) {
    return std::unique_lock<std::mutex>(slot.launchMu);
  }

  static Status Output(const State&, const Call& call, void* out, size_t bytes, bool zero) {
    return zero ? Zero(call, out, bytes) : Status::Ok();
  }

  static Status Zero(const Call& call, void* out, size_t bytes) {
    return MemsetAsync(out, static_cast<int64_t>(bytes), call.stream);
  }

  // The kernels read the offsets table when they run.
  static Status Ragged(const State&, Slot&, const Call& call, CallLeaves& leaves,
                       const ffi::AnyBuffer& base, const void* table) {
    JR_CHECK(
        CopyAsync(leaves.out(0), base.untyped_data(), int64_t(base.size_bytes()), call.stream));
    leaves.table = table;
    return Status::Ok();
  }

  // A rank of a group of several that moves nothing still counts the call (hip/kernel_check.h).
  static bool HasPlan(const Slot& slot) {
    return slot.devPlan != nullptr || (slot.comm != nullptr && slot.comm->nRanks() > 1);
  }

  static Status Run(const State& st, Slot& slot, const Call& call, const CallLeaves& leaves) {
    RankLaunch rl = slot.comm->Launch(slot.rank, call.stream);
    rl.callId = slot.callId;
    rl.checkCalls = st.params.check_calls != 0;
    rl.deviceCheck = static_cast<const int64_t*>(leaves.deviceCheck);
    rl.device = slot.device;
    if (slot.devPlan == nullptr) {
      Status advanced = AdvanceCalls(rl, slot.comm->geo());
      return advanced.ok() ? advanced : OnGroup(st, slot, advanced);
    }
    for (size_t t = 0; t < slot.sources.size(); ++t) {
      const SlotSource& s = slot.sources[t];
      slot.scratch[t].send = leaves.send(s);
      slot.scratch[t].recv = leaves.recv(s);
      slot.scratch[t].scalar = leaves.scalar(size_t(s.leaf));
      if (leaves.table != nullptr) slot.scratch[t].table = leaves.table;
    }
    Status launched = slot.devPlan->Launch(rl, slot.scratch);
    return launched.ok() ? launched : OnGroup(st, slot, launched);
  }
};

}  // namespace
}  // namespace gpu

const FfiRegistration& GpuFfi() {
  return Collective<gpu::GpuBackend>::Registration();
}

}  // namespace jax_rccl
