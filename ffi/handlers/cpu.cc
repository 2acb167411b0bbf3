// The CPU runtime's XLA FFI handlers: the collective handler (ffi/handlers/collective.h) over
// the CPU backend.
//
// execute runs on XLA's CPU pool threads, once per device: the slot of the device id (the
// context's device ordinal is the global id on CPU); the build checks an exported program's
// device (CheckDevice), finds the group's communicator (World) and plans with its topology,
// keeping the plan's fingerprint for the rendezvous. Each call then meets the group's other
// ranks at the communicator's rendezvous (ExecKey: the state's instance, the call site and the
// run id) and runs the plan with the host executor. A rank whose build failed posts its error at
// every call's rendezvous, so the other ranks fail at once instead of at the deadline.
//
// PreMulSum with a per-device scalar operand (premul == 2): the operand's address changes from
// call to call, so each execution copies the operand's scalar into the slot's cell (which the
// plan's user op reads) once the rank's turn on the communicator has come (executions of one
// communicator run one after another, so the cell is never shared by two at once).
#include "ffi/handlers/collective.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ffi/core/params.h"
#include "ffi/core/status.h"
#include "ffi/cpu/comm.h"
#include "ffi/handlers/common.h"
#include "ffi/handlers/ragged.h"
#include "ffi/host/executor.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/types.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_rccl {
namespace cpu {

// The communicator layer (ffi/comm/) and the host executor (ffi/host/) this backend drives.
using comm::CallFingerprint;
using comm::FingerprintPlan;
using comm::HashMix;
using cpu::Arrival;
using cpu::Communicator;
using cpu::ExecKey;
using cpu::World;
using host::ExecContext;
using host::ExecutePlan;

namespace {

// Large outputs are usually fresh memory that the collective is the first to touch: asking for
// transparent huge pages there lets it fault in 2 MiB at a time instead of 4 KiB (a hint; where
// the kernel does not honour it nothing changes).
constexpr size_t kHugePage = size_t(2) << 20;
void AdviseHugePages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < 2 * kHugePage) return;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHugePage - 1);
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

// One device's part of the state: its communicator and (once built) plan.
struct DeviceSlot : SlotBase {
  Communicator* comm = nullptr;
  std::unique_ptr<Plan> plan;
  uint64_t collFingerprint = 0, sendHash = 0, recvHash = 0;
  std::string collText;                   // CallFingerprint::text
  std::vector<RaggedTransfer> transfers;  // ragged_all_to_all: this execution's, by task
  bool oneShot = false;                   // host::OneShotEligible (in-process groups)
  std::vector<Arrival::P2pSlot> p2p;      // a one-shot of point-to-point tasks (Arrival::p2p)
};

std::atomic<int64_t> g_nextInstance{1};

}  // namespace

struct CpuState : CollectiveState<DeviceSlot> {
  static ffi::TypeId id;
  int64_t instance = 0;  // unique per instantiation (part of the rendezvous key)
};

ffi::TypeId CpuState::id = {};

namespace {

struct CpuBackend {
  using State = CpuState;
  using Slot = DeviceSlot;
  struct Call {
    int64_t device;
    int64_t runId;
  };
  static constexpr const char* kStateTypeName = "jax_rccl_cpu_state";
  static constexpr const char* kInstantiateWho = "jax_rccl instantiate";
  static constexpr const char* kExecuteWho = "jax_rccl execute";
  static constexpr bool kOneRankCopies = false;

  static ffi::Error Entry(int32_t device, ffi::RunId runId, State* st, ffi::RemainingArgs args,
                          ffi::RemainingRets rets) {
    return Collective<CpuBackend>::Execute(st, Call{device, runId.run_id}, args, rets);
  }
  static auto ExecuteHandler() {
    return ffi::Ffi::Bind()
        .Ctx<ffi::DeviceOrdinal>()
        .Ctx<ffi::RunId>()
        .Ctx<ffi::State<State>>()
        .RemainingArgs()
        .RemainingRets()
        .To(Entry);
  }

  static ExecKey KeyOf(const State& st, const Call& call) {
    return ExecKey{st.instance, st.callSite, call.runId};
  }

  static void Configure(State& st, std::string_view) { st.instance = g_nextInstance.fetch_add(1); }

  static StatusOr<Slot*> SlotOf(State& st, const Call& call) {
    auto it = st.slots.find(call.device);
    if (it == st.slots.end()) return NotInGroups(st, call.device, "");
    return it->second.get();
  }

  // The device check's value is fixed per executable and device: checked once, at build.
  static Status CheckOperands(const State& st, Slot&, const Call& call,
                              const ffi::RemainingArgs& args, const ffi::RemainingRets& rets) {
    return CheckDevice(st, args, rets.size(), call.device);
  }

  static Status Connect(const State& st, Slot& slot) {
    JR_ASSIGN_OR_RETURN(slot.comm, World::Get().GetOrCreate(st.groups[slot.group], st.params));
    return Status::Ok();
  }

  static Status BuildPlan(const State& st, Slot& slot, std::vector<TaskDesc> tasks) {
    if (tasks.empty()) {
      // Nothing moves on this rank (a ppermute rank outside the permutation, empty leaves), but
      // it still meets the others: their executor may wait for every rank at its barriers.
      auto plan = std::make_unique<jax_rccl::Plan>();
      plan->rank = slot.rank;
      plan->nRanks = static_cast<int>(st.groups[slot.group].size());
      slot.collFingerprint = HashMix(0, static_cast<uint64_t>(st.kind));
      slot.collText = "nothing on this rank";
      slot.plan = std::move(plan);
      return Status::Ok();
    }
    JR_ASSIGN_OR_RETURN(jax_rccl::Plan plan,
                        PlanSlot(st, slot, slot.comm->topo(), std::move(tasks), ""));
    // What the other ranks check at the rendezvous (and, across processes, at the call site's
    // first use).
    CallFingerprint fp = FingerprintPlan(plan, static_cast<uint64_t>(st.kind));
    slot.sendHash = fp.send;
    slot.recvHash = fp.recv;
    slot.collFingerprint = fp.coll;
    slot.collText = std::move(fp.text);
    if (!slot.comm->crossProcess() && st.kind != Kind::kRaggedAllToAll) {
      slot.oneShot = host::OneShotEligible(plan, st.params.cpu_oneshot) ||
                     OneShotPointToPoint(plan, st.params.cpu_oneshot, &slot.p2p);
    }
    slot.plan = std::make_unique<jax_rccl::Plan>(std::move(plan));
    return Status::Ok();
  }

  static void OnFailedCall(const State& st, Slot& slot, const Call& call) {
    if (slot.comm == nullptr) return;
    Arrival arrival;
    arrival.rank = slot.rank;
    arrival.error = slot.buildError;
    (void)slot.comm->Run(KeyOf(st, call), std::move(arrival), st.params.timeout, st.name,
                         [](const ExecContext&) { return Status::Ok(); });
  }

  static Status BeginCall(const State&, Slot&, const Call&) { return Status::Ok(); }
  // Calls of one slot need no lock: each has its own buffers; the rendezvous orders the runs.
  static std::unique_lock<std::mutex> LockCall(Slot&) { return {}; }

  static Status Output(const State& st, const Call&, void* out, size_t bytes, bool zero) {
    if (st.params.huge_pages != 0) AdviseHugePages(out, bytes);
    if (zero) std::memset(out, 0, bytes);
    return Status::Ok();
  }

  static Status Zero(const Call&, void* out, size_t bytes) {
    std::memset(out, 0, bytes);
    return Status::Ok();
  }

  // The table is the same on every rank: a bad entry fails them all here, before they meet.
  static Status Ragged(const State& st, Slot& slot, const Call&, CallLeaves& leaves,
                       const ffi::AnyBuffer& base, const void* table) {
    JR_CHECK(RaggedTransfers(st, slot.rank, slot.ragged, table, &slot.transfers));
    if (base.untyped_data() != leaves.out(0)) {
      std::memcpy(leaves.out(0), base.untyped_data(), base.size_bytes());
    }
    return Status::Ok();
  }

  static bool HasPlan(const Slot& slot) { return slot.plan != nullptr; }

  // A plan of point-to-point tasks only, whose transfers the last rank to arrive copies for all
  // (Arrival::p2p) when every rank's are at most `maxBytes` in all, counted n times (the runner
  // copies every rank's): its slots' descriptors.
  static bool OneShotPointToPoint(const jax_rccl::Plan& plan, int64_t maxBytes,
                                  std::vector<Arrival::P2pSlot>* out) {
    out->clear();
    if (maxBytes <= 0 || plan.nRanks < 2 || plan.tasks.empty()) return false;
    std::vector<Arrival::P2pSlot> slots;
    std::map<std::pair<bool, int>, int> seen;  // (send, peer) -> transfers so far
    int64_t sent = 0, received = 0;
    for (const TaskPlan& tp : plan.tasks) {
      if (tp.coll != Coll::kSend && tp.coll != Coll::kRecv) return false;
      Arrival::P2pSlot s;
      s.send = tp.coll == Coll::kSend;
      s.peer = tp.peer;
      s.k = seen[{s.send, tp.peer}]++;
      s.bytes = int64_t(tp.count) * int64_t(DataTypeSize(tp.dtype));
      (s.send ? sent : received) += s.bytes;
      slots.push_back(s);
    }
    if (std::max(sent, received) * plan.nRanks > maxBytes) return false;
    *out = std::move(slots);
    return true;
  }

  static Status Run(const State& st, Slot& slot, const Call& call, const CallLeaves& leaves) {
    Arrival arrival;
    arrival.rank = slot.rank;
    arrival.collFingerprint = slot.collFingerprint;
    arrival.what = slot.collText;
    arrival.sendHash = slot.sendHash;
    arrival.recvHash = slot.recvHash;
    arrival.oneShot = slot.oneShot;
    arrival.p2p = &slot.p2p;
    arrival.slots.resize(slot.sources.size());
    const bool ragged = st.kind == Kind::kRaggedAllToAll;
    for (size_t t = 0; t < slot.sources.size(); ++t) {
      const SlotSource& s = slot.sources[t];
      host::SlotBuffers& b = arrival.slots[t];
      b.send = leaves.send(s);
      b.recv = leaves.recv(s);
      if (ragged) {
        const RaggedTransfer& x = slot.transfers[t];
        if (s.send) b.send = static_cast<const char*>(b.send) + x.offset;
        if (s.recv) b.recv = static_cast<char*>(b.recv) + x.offset;
        b.bytes = x.bytes;
      }
    }
    const jax_rccl::Plan& plan = *slot.plan;
    return slot.comm->Run(KeyOf(st, call), std::move(arrival), st.params.timeout, st.name,
                          [&](const ExecContext& ctx) -> Status {
                            if (st.premul == 2) {
                              for (size_t i = 0; i < leaves.size(); ++i) {
                                std::memcpy(&slot.scalarCells[i], leaves.scalar(i),
                                            DataTypeSize(slot.leaves.types[i]));
                              }
                            }
                            return ExecutePlan(plan, ctx);
                          });
  }
};

}  // namespace
}  // namespace cpu

const FfiRegistration& CpuFfi() {
  return Collective<cpu::CpuBackend>::Registration();
}

}  // namespace jax_rccl
