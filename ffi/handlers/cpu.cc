// The CPU runtime's XLA FFI handlers.
//
// Every target shares one body: the kind (all_reduce, ..., ppermute) is a template argument of
// the instantiate stage and a field of the state; the execute stage is one handler for all.
//
// instantiate (once per executable, on a compile thread): parses and validates the attributes,
//   reads the parameters (ffi/core/params.h) and creates the state: one slot per device of the
//   replica groups, each with its rank and, later, its plan.
// execute (each call, once per device, on pool threads): maps the device to its slot, builds the
//   slot's plan on its first call (under the slot's mutex; later calls only read it), fills the
//   task slots' buffers, meets the group's other ranks at the communicator's rendezvous and runs
//   the plan with the host executor.
//
// PreMulSum with a per-device scalar operand (premul == 2): the plan's user op reads its scalar
// through a pointer (ScalarResidence::kDevice). The operand's address changes from call to call,
// so the op points at a cell owned by the device's slot instead, and each execution copies the
// operand's scalar into that cell once the rank's turn on the communicator has come (executions
// of one communicator run one after another, so the cell is never shared by two at once). The
// plan stays the same across calls.
#include "ffi/handlers/cpu.h"

#include <atomic>

#include "ffi/core/stats.h"
#if defined(__linux__)
#include <sys/mman.h>
#endif
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
#include "ffi/core/status.h"
#include "ffi/handlers/common.h"
#include "ffi/handlers/ragged.h"
#include "ffi/host/executor.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/redop.h"
#include "ffi/planner/types.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_rccl {
namespace cpu {

// The communicator layer (ffi/comm/) and the host executor (ffi/host/) this handler drives.
using comm::Arrival;
using comm::CallFingerprint;
using comm::Communicator;
using comm::CpuTopology;
using comm::ExecKey;
using comm::FingerprintPlan;
using comm::HashMix;
using comm::World;
using host::ExecContext;
using host::ExecutePlan;
using host::SlotBuffers;

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

// One device's part of the state: its rank, communicator and (once built) plan.
struct DeviceSlot {
  int64_t device = 0;
  int group = 0;  // index into CpuState::groups
  int rank = 0;

  std::mutex mu;  // guards the build
  std::atomic<bool> built{false};
  Status buildError;  // sticky: the shapes of an executable do not change
  Communicator* comm = nullptr;
  RedOpTable userOps;
  std::unique_ptr<Plan> plan;
  std::vector<SlotSource> sources;             // by task slot
  Leaves leaves;                               // as planned
  std::vector<uint8_t> zeroBefore, zeroAfter;  // by leaf: outputs this rank zeroes
  std::unique_ptr<uint64_t[]> scalarCells;     // premul == 2: one per leaf
  uint64_t collFingerprint = 0, sendHash = 0, recvHash = 0;
  std::string collText;                   // CallFingerprint::text
  RaggedShape ragged;                     // ragged_all_to_all only
  std::vector<RaggedTransfer> transfers;  // ragged_all_to_all: this execution's, by task
};

}  // namespace

// The state of one call site in one executable (shared by all its devices; thread-safe: the
// fields are written at instantiate, the slots build their plans under their own mutexes).
struct CpuState : CallAttrs {
  static ffi::TypeId id;
  int64_t instance = 0;  // unique per instantiation (part of the rendezvous key)
  std::unordered_map<int64_t, std::unique_ptr<DeviceSlot>> slots;  // by device id; fixed
};

ffi::TypeId CpuState::id = {};

namespace {

std::atomic<int64_t> g_nextInstance{1};

StatusOr<std::unique_ptr<CpuState>> MakeState(Kind kind, ffi::Span<const int64_t> groups,
                                              int64_t groupSize, int32_t op, int32_t premul,
                                              double premulValue, int64_t root,
                                              ffi::Span<const int64_t> perm,
                                              std::string_view algorithm, std::string_view protocol,
                                              int64_t callSite, std::string_view name) {
  auto st = std::make_unique<CpuState>();
  st->instance = g_nextInstance.fetch_add(1);
  JR_CHECK(ParseCallAttrs(kind, groups, groupSize, op, premul, premulValue, root, perm, algorithm,
                          protocol, callSite, name, st.get()));
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

// Builds `slot`'s plan from the shapes of its first call.
Status BuildPlan(const CpuState& st, DeviceSlot& slot, const ffi::RemainingArgs& args,
                 const ffi::RemainingRets& rets) {
  const int n = static_cast<int>(st.groups[slot.group].size());
  const bool ragged = st.kind == Kind::kRaggedAllToAll;
  JR_CHECK(ragged ? ReadRaggedLeaves(st, args, rets, &slot.ragged, &slot.leaves)
                  : ReadLeaves(st, args, rets, &slot.leaves));
  JR_ASSIGN_OR_RETURN(slot.comm, World::Get().GetOrCreate(st.groups[slot.group], st.params));
  const size_t nLeaves = slot.leaves.size();
  RankTasks rt = ragged ? MakeRaggedTasks(st, slot.rank, slot.ragged)
                        : MakeRankTasks(st, slot.rank, slot.leaves, /*oneRankCopies=*/false);
  std::vector<TaskDesc>& tasks = rt.tasks;
  slot.sources = std::move(rt.sources);
  slot.zeroBefore = std::move(rt.zeroBefore);
  slot.zeroAfter = std::move(rt.zeroAfter);
  if (st.premul != 0) {
    if (st.premul == 2) slot.scalarCells = std::make_unique<uint64_t[]>(nLeaves);
    for (TaskDesc& t : tasks) {
      const size_t leaf = slot.sources[&t - tasks.data()].leaf;
      if (st.premul == 1) {
        const uint64_t bits = ScalarBits(st.premulValue, t.dtype);
        JR_ASSIGN_OR_RETURN(
            t.op, slot.userOps.CreatePreMulSum(&bits, t.dtype, ScalarResidence::kHostImmediate));
      } else {
        JR_ASSIGN_OR_RETURN(t.op, slot.userOps.CreatePreMulSum(&slot.scalarCells[leaf], t.dtype,
                                                               ScalarResidence::kDevice));
      }
    }
  }
  if (tasks.empty()) {
    // Nothing moves on this rank (a ppermute rank outside the permutation, empty leaves), but
    // it still meets the others: their executor may wait for every rank at its barriers.
    auto plan = std::make_unique<Plan>();
    plan->rank = slot.rank;
    plan->nRanks = n;
    slot.collFingerprint = HashMix(0, static_cast<uint64_t>(st.kind));
    slot.collText = "nothing on this rank";
    slot.plan = std::move(plan);
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
  if (st.params.debug == "INFO" || st.params.debug == "TRACE") LogPlan(st, slot.rank, plan, "");

  // What the other ranks check at the rendezvous (and, across processes, at the call site's
  // first use).
  CallFingerprint fp = FingerprintPlan(plan, static_cast<uint64_t>(st.kind));
  slot.sendHash = fp.send;
  slot.recvHash = fp.recv;
  slot.collFingerprint = fp.coll;
  slot.collText = std::move(fp.text);
  slot.plan = std::make_unique<Plan>(std::move(plan));
  Stats().plansBuilt.fetch_add(1);
  return Status::Ok();
}

Status Execute(CpuState& st, int64_t device, int64_t runId, const ffi::RemainingArgs& args,
               const ffi::RemainingRets& rets) {
  auto it = st.slots.find(device);
  if (it == st.slots.end()) {
    std::string all;
    for (const auto& g : st.groups) {
      all += "[";
      for (size_t i = 0; i < g.size(); ++i) all += (i ? ", " : "") + std::to_string(g[i]);
      all += "]";
    }
    JR_FAIL(Code::kInvalidArgument, "jax_rccl '", st.name, "': device ", device,
            " is in none of the replica groups ", all);
  }
  DeviceSlot& slot = *it->second;
  if (!slot.built.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (!slot.built.load(std::memory_order_relaxed)) {
      // The device check's value is fixed per executable and device: checked once, at build.
      slot.buildError = CheckDevice(st, args, rets.size(), device);
      if (slot.buildError.ok()) slot.buildError = BuildPlan(st, slot, args, rets);
      slot.built.store(true, std::memory_order_release);
    }
  }
  const ExecKey key{st.instance, st.callSite, runId};
  if (!slot.buildError.ok()) {
    if (slot.comm != nullptr) {  // let the other ranks fail at once instead of at the deadline
      Arrival arrival;
      arrival.rank = slot.rank;
      arrival.error = slot.buildError;
      (void)slot.comm->Run(key, std::move(arrival), st.params.timeout, st.name,
                           [](const ExecContext&) { return Status::Ok(); });
    }
    Status s = slot.buildError;
    JR_STATUS_FRAME_(s);
    return s;
  }
  Stats().executions.fetch_add(1, std::memory_order_relaxed);

  const size_t nLeaves = slot.leaves.size();
  JR_REQUIRE(rets.size() == nLeaves, Code::kInvalidArgument, "jax_rccl '", st.name,
             "': called with ", rets.size(), " results; the plan has ", nLeaves);
  // Pointers of this call (the shapes are those the plan was built for).
  void* inPtr[64];
  void* outPtr[64];
  std::vector<void*> inHeap, outHeap;
  void** in = inPtr;
  void** out = outPtr;
  if (nLeaves > 64) {
    inHeap.resize(nLeaves);
    outHeap.resize(nLeaves);
    in = inHeap.data();
    out = outHeap.data();
  }
  for (size_t i = 0; i < nLeaves; ++i) {
    auto a = args.get<ffi::AnyBuffer>(i);
    auto b = rets.get<ffi::AnyBuffer>(i);
    JR_REQUIRE(a.has_value() && b.has_value() && a->size_bytes() == slot.leaves.inBytes[i] &&
                   (*b)->size_bytes() == slot.leaves.outBytes[i],
               Code::kInvalidArgument, "jax_rccl '", st.name, "': leaf ", i,
               " changed shape since the plan was built");
    in[i] = a->untyped_data();
    out[i] = (*b)->untyped_data();
    if (st.params.huge_pages != 0) AdviseHugePages(out[i], slot.leaves.outBytes[i]);
    if (slot.zeroBefore[i]) std::memset(out[i], 0, slot.leaves.outBytes[i]);
  }
  if (st.kind == Kind::kRaggedAllToAll) {
    // The table is the same on every rank: a bad entry fails them all here, before they meet.
    auto base = args.get<ffi::AnyBuffer>(1);
    auto table = args.get<ffi::AnyBuffer>(2);
    JR_REQUIRE(base.has_value() && table.has_value(), Code::kInvalidArgument, "jax_rccl '", st.name,
               "': output or offsets table is not a buffer");
    JR_CHECK(RaggedTransfers(st, slot.rank, slot.ragged, table->untyped_data(), &slot.transfers));
    if (base->untyped_data() != out[0])
      std::memcpy(out[0], base->untyped_data(), base->size_bytes());
  }
  if (slot.plan) {
    Arrival arrival;
    arrival.rank = slot.rank;
    arrival.collFingerprint = slot.collFingerprint;
    arrival.what = slot.collText;
    arrival.sendHash = slot.sendHash;
    arrival.recvHash = slot.recvHash;
    arrival.slots.resize(slot.sources.size());
    for (size_t t = 0; t < slot.sources.size(); ++t) {
      const SlotSource& s = slot.sources[t];
      if (s.send) arrival.slots[t].send = static_cast<const char*>(in[s.leaf]) + s.sendOffset;
      if (s.recv) arrival.slots[t].recv = static_cast<char*>(out[s.leaf]) + s.recvOffset;
      if (st.kind == Kind::kRaggedAllToAll) {
        const RaggedTransfer& x = slot.transfers[t];
        if (s.send)
          arrival.slots[t].send = static_cast<const char*>(arrival.slots[t].send) + x.offset;
        if (s.recv) arrival.slots[t].recv = static_cast<char*>(arrival.slots[t].recv) + x.offset;
        arrival.slots[t].bytes = x.bytes;
      }
    }
    const Plan& plan = *slot.plan;
    JR_CHECK(slot.comm->Run(
        key, std::move(arrival), st.params.timeout, st.name, [&](const ExecContext& ctx) -> Status {
          if (st.premul == 2) {
            for (size_t i = 0; i < nLeaves; ++i) {
              auto sc = args.get<ffi::AnyBuffer>(nLeaves + i);
              JR_REQUIRE(sc.has_value(), Code::kInvalidArgument, "jax_rccl '", st.name,
                         "': premul operand ", nLeaves + i, " is not a buffer");
              std::memcpy(&slot.scalarCells[i], sc->untyped_data(),
                          DataTypeSize(slot.leaves.types[i]));
            }
          }
          return ExecutePlan(plan, ctx);
        }));
  }
  for (size_t i = 0; i < nLeaves; ++i) {
    if (slot.zeroAfter[i]) std::memset(out[i], 0, slot.leaves.outBytes[i]);
  }
  return Status::Ok();
}

// ---- The FFI entry points ----

template <Kind K>
ffi::ErrorOr<std::unique_ptr<CpuState>> InstantiateFor(
    ffi::Span<const int64_t> groups, int64_t groupSize, int32_t op, int32_t premul,
    double premulValue, int64_t root, ffi::Span<const int64_t> perm, std::string_view algorithm,
    std::string_view protocol, int64_t callSite, std::string_view name) {
  return GuardInstantiate<CpuState>("jax_rccl instantiate", [&] {
    StatusOr<std::unique_ptr<CpuState>> st =
        MakeState(K, groups, groupSize, op, premul, premulValue, root, perm, algorithm, protocol,
                  callSite, name);
    if (st.ok()) Stats().instantiations.fetch_add(1);
    return st;
  });
}

ffi::Error ExecuteEntry(int32_t device, ffi::RunId runId, CpuState* st, ffi::RemainingArgs args,
                        ffi::RemainingRets rets) {
  if (st == nullptr) return ffi::Error::Internal("jax_rccl execute: no state (not instantiated)");
  return GuardExecute("jax_rccl execute", &Stats().errors,
                      [&] { return Execute(*st, device, runId.run_id, args, rets); });
}

}  // namespace
}  // namespace cpu
}  // namespace jax_rccl

// One execute handler for every target (the kind lives in the state); one instantiate handler
// per kind.
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_rccl_cpu_execute, jax_rccl::cpu::ExecuteEntry,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Ctx<xla::ffi::RunId>()
                                  .Ctx<xla::ffi::State<jax_rccl::cpu::CpuState>>()
                                  .RemainingArgs()
                                  .RemainingRets());

#define JAX_RCCL_CPU_INSTANTIATE(name, kind)                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_rccl_cpu_instantiate_##kind,                        \
                                jax_rccl::cpu::InstantiateFor<jax_rccl::Kind::k##kind>, \
                                jax_rccl::InstantiateAttrs());
JAX_RCCL_FFI_KINDS(JAX_RCCL_CPU_INSTANTIATE)
#undef JAX_RCCL_CPU_INSTANTIATE

namespace jax_rccl {
namespace cpu {

const std::vector<FfiTarget>& CpuFfiTargets() {
  static const std::vector<FfiTarget> targets = {
#define JAX_RCCL_CPU_TARGET(name, kind)                                        \
  {"jax_rccl_" name, reinterpret_cast<void*>(jax_rccl_cpu_instantiate_##kind), \
   reinterpret_cast<void*>(jax_rccl_cpu_execute)},
      JAX_RCCL_FFI_KINDS(JAX_RCCL_CPU_TARGET)
#undef JAX_RCCL_CPU_TARGET
  };
  return targets;
}

void* CpuStateTypeId() {
  return &CpuState::id;
}

void* CpuStateTypeInfo() {
  static XLA_FFI_TypeInfo info = ffi::MakeTypeInfo<CpuState>();
  return &info;
}

}  // namespace cpu
}  // namespace jax_rccl
