// The collective handler of every platform: one template over a small backend interface.
//
// Every target shares one body: the kind (all_reduce, ..., ragged_all_to_all) is a template
// argument of the instantiate stage and a field of the state; the execute stage is one handler
// for all kinds.
//
// instantiate (once per call site per executable, no device): parses and validates the
//   attributes (ffi/handlers/common.h), reads the parameters and creates the state: one slot per
//   device of the replica groups, each with its group and rank.
// execute (each call, once per device): maps the call's device to its slot; on the slot's first
//   call (under the slot's mutex; later calls only read what it built) checks the device,
//   reads the leaves, finds the group's communicator, lists the rank's tasks (PreMulSum ops for
//   premul) and has the backend plan them. A build that failed fails every later call of the
//   slot with the same error, and on every such call the backend tells the group's other ranks,
//   so they fail at once instead of at their deadline. Every call then binds this call's operands
//   and results to the leaves (same shapes as planned), zeroes the outputs the rank does not
//   write, sets up ragged_all_to_all's table, and has the backend run (CPU) or launch (GPU) the
//   plan.
//
// PreMulSum (premul, reducing kinds only): premul == 1 scales by the immediate `premul_value`
// (ScalarResidence::kHostImmediate, in the plan). premul == 2 takes one scalar operand per leaf
// whose value changes from call to call: the plan's user op is made with
// ScalarResidence::kDevice over a cell of the slot (CallLeaves::scalar gives the backend each
// call's operand; the CPU copies its value into the cell when the rank's turn on the
// communicator comes, the GPU passes the operand's address to the kernels, which read it when
// they run). The plan stays the same across calls.
//
// A backend B (ffi/handlers/cpu.cc, ffi/handlers/gpu.cc) gives the members that
// BackendContract<B> (below) lists with their exact signatures; the compiler checks them where
// Collective<B> is instantiated.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ffi/core/stats.h"
#include "ffi/core/status.h"
#include "ffi/handlers/common.h"
#include "ffi/handlers/ragged.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/redop.h"
#include "ffi/planner/types.h"
#include "xla/ffi/api/ffi.h"

namespace jax_rccl {

// One FFI target: its name and its two stages' handlers.
struct FfiTarget {
  const char* name;   // "jax_rccl_all_reduce", ...
  void* instantiate;  // XLA_FFI_Handler*
  void* execute;      // XLA_FFI_Handler*
};

// What a platform registers with JAX (jax_rccl/_ffi.py): its state type and its targets.
struct FfiRegistration {
  const char* stateTypeName;       // jax.ffi.register_ffi_type's name
  void* typeId;                    // &State::id (an XLA_FFI_TypeId*)
  void* typeInfo;                  // the state's XLA_FFI_TypeInfo*
  std::vector<FfiTarget> targets;  // one per kind, in the contract's order
};

// The CPU runtime's (ffi/handlers/cpu.cc: state type "jax_rccl_cpu_state", platform cpu).
const FfiRegistration& CpuFfi();
#if defined(JAX_RCCL_WITH_GPU)
// The GPU runtime's (ffi/handlers/gpu.cc: "jax_rccl_gpu_state", platforms CUDA and ROCM).
const FfiRegistration& GpuFfi();
#endif

// An FFI instantiate entry's body: `make()` returns StatusOr<std::unique_ptr<State>>; a failed
// Status becomes its ffi::Error, an exception an internal error prefixed with `who`.
template <typename State, typename Make>
xla::ffi::ErrorOr<std::unique_ptr<State>> GuardInstantiate(const char* who, Make&& make) {
  try {
    StatusOr<std::unique_ptr<State>> st = make();
    if (!st.ok()) return xla::ffi::Unexpected(ToFfiError(st.status()));
    return st.take();
  } catch (const std::exception& e) {
    return xla::ffi::Unexpected(xla::ffi::Error::Internal(std::string(who) + ": " + e.what()));
  } catch (...) {
    return xla::ffi::Unexpected(
        xla::ffi::Error::Internal(std::string(who) + ": unknown exception"));
  }
}

// An FFI execute entry's body: `run()` returns a Status; a failure (or an exception, an internal
// error prefixed with `who`) bumps `*errors` and becomes its ffi::Error.
template <typename Counter, typename Run>
xla::ffi::Error GuardExecute(const char* who, Counter* errors, Run&& run) {
  try {
    Status s = run();
    if (!s.ok()) errors->fetch_add(1);
    return ToFfiError(s);
  } catch (const std::exception& e) {
    errors->fetch_add(1);
    return xla::ffi::Error::Internal(std::string(who) + ": " + e.what());
  } catch (...) {
    errors->fetch_add(1);
    return xla::ffi::Error::Internal(std::string(who) + ": unknown exception");
  }
}

// The instantiate binding of every target: the attributes as one dictionary, read by
// `DecodeCallAttrs` (the contract's ABI versions, kAbiVersion).
inline auto InstantiateAttrs() {
  return xla::ffi::Ffi::BindInstantiate().Attrs<xla::ffi::Dictionary>();
}

// One device's part of a call site's state, as every platform keeps it.
struct SlotBase {
  int64_t device = 0;
  int group = 0;  // index into CallAttrs::groups
  int rank = 0;

  std::mutex mu;  // guards the build
  std::atomic<bool> built{false};
  Status buildError;  // sticky: the shapes of an executable do not change
  RedOpTable userOps;
  std::vector<SlotSource> sources;             // by task slot
  Leaves leaves;                               // as planned
  std::vector<uint8_t> zeroBefore, zeroAfter;  // by leaf: outputs this rank zeroes
  std::unique_ptr<uint64_t[]> scalarCells;     // premul == 2: one per leaf, names its user op
  RaggedShape ragged;                          // ragged_all_to_all only
  int64_t callBytes = 0;  // the message size of one call (CallSiteStats::bytes), set by the build
  int32_t planAlgo = -1, planProto = -1;  // the plan's choice (CallSiteStats::algo), by PlanSlot
  // The operand index of an exported program's device check that the backend reads at every call
  // (GPU: where the host could not read it at the first; CallLeaves::deviceCheck), or -1.
  int deviceCheckAt = -1;
};

// The state of one call site in one executable (shared by all its devices; thread-safe: the
// fields are written at instantiate, the slots build their plans under their own mutexes).
template <typename Slot>
struct CollectiveState : CallAttrs {
  std::unordered_map<int64_t, std::unique_ptr<Slot>> slots;  // by device id; fixed
  CallSiteStats* record = nullptr;  // the call site's timings (jax_rccl.profile())
};

// "[0, 1][2, 3]": the replica groups, for messages.
std::string GroupsText(const CallAttrs& attrs);

// The error of a device that is in none of the replica groups (`where` follows the device id:
// "" or " (GPU ordinal 3)").
Status NotInGroups(const CallAttrs& attrs, int64_t device, const std::string& where);

// The first call's part of a build before the communicator: reads and checks the leaves (and
// the ragged shape) into `slot`.
Status ReadSlotLeaves(const CallAttrs& attrs, SlotBase& slot, const xla::ffi::RemainingArgs& args,
                      const xla::ffi::RemainingRets& rets);

// The rank's task list (its buffers' sources and the outputs it zeroes into `slot`), with the
// PreMulSum user ops of premul made in slot.userOps.
StatusOr<std::vector<TaskDesc>> SlotTasks(const CallAttrs& attrs, SlotBase& slot,
                                          bool oneRankCopies);

// The slot's persistent plan of `tasks` over `topo`, logged under JAX_RCCL_DEBUG (`where`:
// LogPlan's).
StatusOr<Plan> PlanSlot(const CallAttrs& attrs, SlotBase& slot, const TopologyView& topo,
                        std::vector<TaskDesc> tasks, const char* where);

// The buffers of one call by leaf: operand, result and (premul == 2) scalar operand. Up to 64
// leaves without allocation.
class CallLeaves {
 public:
  explicit CallLeaves(size_t n);
  size_t size() const { return n_; }
  void* in(size_t i) const { return p_[i]; }
  void* out(size_t i) const { return p_[n_ + i]; }
  const void* scalar(size_t i) const { return p_[2 * n_ + i]; }
  // The task slot's send (operand + offset) and receive (result + offset) buffers; null where
  // the task has none.
  const void* send(const SlotSource& s) const {
    return s.send ? static_cast<const char*>(in(size_t(s.leaf))) + s.sendOffset : nullptr;
  }
  void* recv(const SlotSource& s) const {
    return s.recv ? static_cast<char*>(out(size_t(s.leaf))) + s.recvOffset : nullptr;
  }
  const void* table = nullptr;        // ragged_all_to_all: the offsets table
  const void* deviceCheck = nullptr;  // SlotBase::deviceCheckAt's operand, or null

  // Binds this call's operands and results (and premul scalars) to the planned leaves; fails if
  // a leaf changed shape.
  Status Bind(const CallAttrs& attrs, const SlotBase& slot, const xla::ffi::RemainingArgs& args,
              const xla::ffi::RemainingRets& rets);

 private:
  static constexpr size_t kInline = 64;
  size_t n_;
  void* inline_[3 * kInline];
  std::vector<void*> heap_;
  void** p_;
};

// What a backend B supplies, checked by the compiler (each member's role in the order the handler
// uses them):
//   State, Slot      its state (derived from CollectiveState<Slot>, with `static ffi::TypeId id`)
//                    and slot (derived from SlotBase) types;
//   Call             what the execute context says of the call (device, run id or stream);
//   kStateTypeName   the state type's registered name;
//   ExecuteHandler() the execute stage's handler (Ffi::Bind()...To(...)): its context and
//                    traits, calling Collective<B>::Execute;
//   kInstantiateWho, kExecuteWho   prefixes of internal errors;
//   kOneRankCopies   MakeRankTasks's argument;
//   Configure        after the attributes are parsed;
//   SlotOf           the call's slot;
//   CheckOperands    at the slot's first call;
//   Connect          the group's communicator;
//   BuildPlan        plan (upload), keep;
//   OnFailedCall     a call of a slot whose build failed;
//   BeginCall, LockCall   before the call's buffers are bound;
//   Output, Zero     a result's buffer before and after the collective;
//   Ragged           ragged_all_to_all's result base and offsets table;
//   HasPlan          whether the call runs anything on this rank;
//   Run              the call.
template <typename B>
struct BackendContract {
  using State = typename B::State;
  using Slot = typename B::Slot;
  using Call = typename B::Call;
  using Args = xla::ffi::RemainingArgs;
  using Rets = xla::ffi::RemainingRets;
  template <typename Want, typename Got>
  static constexpr bool kIs = std::is_same_v<Want, Got>;

  static_assert(std::is_base_of_v<CollectiveState<Slot>, State>,
                "B::State derives from CollectiveState<B::Slot>");
  static_assert(std::is_base_of_v<SlotBase, Slot>, "B::Slot derives from SlotBase");
  static_assert(kIs<xla::ffi::TypeId, std::remove_cv_t<decltype(State::id)>>,
                "B::State has `static xla::ffi::TypeId id`");
  static_assert(std::is_convertible_v<decltype(B::kStateTypeName), const char*> &&
                    std::is_convertible_v<decltype(B::kInstantiateWho), const char*> &&
                    std::is_convertible_v<decltype(B::kExecuteWho), const char*>,
                "B::kStateTypeName, kInstantiateWho and kExecuteWho are strings");
  static_assert(kIs<const bool, decltype(B::kOneRankCopies)>, "B::kOneRankCopies is a bool");
  static_assert(kIs<void (*)(State&, std::string_view), decltype(&B::Configure)>,
                "B::Configure(State&, std::string_view protocol)");
  static_assert(kIs<StatusOr<Slot*> (*)(State&, const Call&), decltype(&B::SlotOf)>,
                "B::SlotOf(State&, const Call&) -> StatusOr<Slot*>");
  static_assert(kIs<Status (*)(const State&, Slot&, const Call&, const Args&, const Rets&),
                    decltype(&B::CheckOperands)>,
                "B::CheckOperands(const State&, Slot&, const Call&, args, rets) -> Status");
  static_assert(kIs<Status (*)(const State&, Slot&), decltype(&B::Connect)>,
                "B::Connect(const State&, Slot&) -> Status");
  static_assert(
      kIs<Status (*)(const State&, Slot&, std::vector<TaskDesc>), decltype(&B::BuildPlan)>,
      "B::BuildPlan(const State&, Slot&, std::vector<TaskDesc>) -> Status");
  static_assert(kIs<void (*)(const State&, Slot&, const Call&), decltype(&B::OnFailedCall)>,
                "B::OnFailedCall(const State&, Slot&, const Call&)");
  static_assert(kIs<Status (*)(const State&, Slot&, const Call&), decltype(&B::BeginCall)>,
                "B::BeginCall(const State&, Slot&, const Call&) -> Status");
  static_assert(kIs<std::unique_lock<std::mutex> (*)(Slot&), decltype(&B::LockCall)>,
                "B::LockCall(Slot&) -> std::unique_lock<std::mutex>");
  static_assert(
      kIs<Status (*)(const State&, const Call&, void*, size_t, bool), decltype(&B::Output)>,
      "B::Output(const State&, const Call&, void* out, size_t bytes, bool zero) -> Status");
  static_assert(kIs<Status (*)(const Call&, void*, size_t), decltype(&B::Zero)>,
                "B::Zero(const Call&, void* out, size_t bytes) -> Status");
  static_assert(kIs<Status (*)(const State&, Slot&, const Call&, CallLeaves&,
                               const xla::ffi::AnyBuffer&, const void*),
                    decltype(&B::Ragged)>,
                "B::Ragged(const State&, Slot&, const Call&, CallLeaves&, const AnyBuffer& output, "
                "const void* table) -> Status");
  static_assert(kIs<bool (*)(const Slot&), decltype(&B::HasPlan)>,
                "B::HasPlan(const Slot&) -> bool");
  static_assert(
      kIs<Status (*)(const State&, Slot&, const Call&, const CallLeaves&), decltype(&B::Run)>,
      "B::Run(const State&, Slot&, const Call&, const CallLeaves&) -> Status");
  static constexpr bool kChecked = true;
};

// The collective handler over backend B (see BackendContract).
template <typename B>
class Collective {
  static_assert(BackendContract<B>::kChecked);

 public:
  using State = typename B::State;
  using Slot = typename B::Slot;
  using Call = typename B::Call;

  template <Kind K>
  static xla::ffi::ErrorOr<std::unique_ptr<State>> Instantiate(xla::ffi::Dictionary attrs) {
    return GuardInstantiate<State>(B::kInstantiateWho, [&]() -> StatusOr<std::unique_ptr<State>> {
      auto st = std::make_unique<State>();
      JR_CHECK(DecodeCallAttrs(K, attrs, st.get()));
      B::Configure(*st, st->protocolText);
      st->record = CallSiteRecord(st->callSite, st->name, KindName(K), st->groupSize);
      for (size_t g = 0; g < st->groups.size(); ++g) {
        for (int r = 0; r < static_cast<int>(st->groups[g].size()); ++r) {
          auto slot = std::make_unique<Slot>();
          slot->device = st->groups[g][size_t(r)];
          slot->group = static_cast<int>(g);
          slot->rank = r;
          st->slots.emplace(slot->device, std::move(slot));
        }
      }
      Stats().instantiations.fetch_add(1);
      return st;
    });
  }

  static xla::ffi::Error Execute(State* st, const Call& call, const xla::ffi::RemainingArgs& args,
                                 const xla::ffi::RemainingRets& rets) {
    if (st == nullptr) {
      return xla::ffi::Error::Internal(std::string(B::kExecuteWho) +
                                       ": no state (not instantiated)");
    }
    return GuardExecute(B::kExecuteWho, &Stats().errors,
                        [&] { return ExecuteCall(*st, call, args, rets); });
  }

  // The state type and the targets, one per kind in the contract's order, with one execute
  // handler for all (the kind lives in the state).
  static const FfiRegistration& Registration() {
    static XLA_FFI_TypeInfo info = xla::ffi::MakeTypeInfo<State>();
    static const FfiRegistration reg = {B::kStateTypeName,
                                        &State::id,
                                        &info,
                                        {
#define JAX_RCCL_COLLECTIVE_TARGET(name, kind)                                    \
  {"jax_rccl_" name, reinterpret_cast<void*>(&InstantiateHandler<Kind::k##kind>), \
   reinterpret_cast<void*>(&ExecuteHandler)},
                                            JAX_RCCL_FFI_KINDS(JAX_RCCL_COLLECTIVE_TARGET)
#undef JAX_RCCL_COLLECTIVE_TARGET
                                        }};
    return reg;
  }

 private:
  template <Kind K>
  static XLA_FFI_Error* InstantiateHandler(XLA_FFI_CallFrame* frame) {
    static auto* handler = InstantiateAttrs().To(&Instantiate<K>).release();
    return handler->Call(frame);
  }

  static XLA_FFI_Error* ExecuteHandler(XLA_FFI_CallFrame* frame) {
    static auto* handler = B::ExecuteHandler().release();
    return handler->Call(frame);
  }

  static Status Build(const State& st, Slot& slot, const Call& call,
                      const xla::ffi::RemainingArgs& args, const xla::ffi::RemainingRets& rets) {
    JR_CHECK(B::CheckOperands(st, slot, call, args, rets));
    JR_CHECK(ReadSlotLeaves(st, slot, args, rets));
    JR_CHECK(B::Connect(st, slot));
    JR_ASSIGN_OR_RETURN(std::vector<TaskDesc> tasks, SlotTasks(st, slot, B::kOneRankCopies));
    JR_CHECK(B::BuildPlan(st, slot, std::move(tasks)));
    Stats().plansBuilt.fetch_add(1);
    const std::vector<size_t>& sized =
        st.kind == Kind::kAllGather ? slot.leaves.outBytes : slot.leaves.inBytes;
    for (size_t b : sized) slot.callBytes += static_cast<int64_t>(b);
    if (st.record != nullptr && slot.planAlgo != -1) {
      st.record->algo.store(slot.planAlgo, std::memory_order_relaxed);
      st.record->proto.store(slot.planProto, std::memory_order_relaxed);
    }
    return Status::Ok();
  }

  static Status ExecuteCall(State& st, const Call& call, const xla::ffi::RemainingArgs& args,
                            const xla::ffi::RemainingRets& rets) {
    JR_ASSIGN_OR_RETURN(Slot * slotPtr, B::SlotOf(st, call));
    Slot& slot = *slotPtr;
    if (!slot.built.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(slot.mu);
      if (!slot.built.load(std::memory_order_relaxed)) {
        slot.buildError = Build(st, slot, call, args, rets);
        slot.built.store(true, std::memory_order_release);
      }
    }
    if (!slot.buildError.ok()) {
      B::OnFailedCall(st, slot, call);
      Status s = slot.buildError;
      JR_STATUS_FRAME_(s);
      return s;
    }
    Stats().executions.fetch_add(1, std::memory_order_relaxed);
    CallTimer timer(st.record, slot.device, slot.callBytes);

    const size_t nLeaves = slot.leaves.size();
    JR_REQUIRE(rets.size() == nLeaves, Code::kInvalidArgument, "jax_rccl '", st.name,
               "': called with ", rets.size(), " results; the plan has ", nLeaves);
    JR_CHECK(B::BeginCall(st, slot, call));
    std::unique_lock<std::mutex> lock = B::LockCall(slot);
    CallLeaves leaves(nLeaves);
    JR_CHECK(leaves.Bind(st, slot, args, rets));
    for (size_t i = 0; i < nLeaves; ++i) {
      JR_CHECK(B::Output(st, call, leaves.out(i), slot.leaves.outBytes[i], slot.zeroBefore[i]));
    }
    if (st.kind == Kind::kRaggedAllToAll) {
      // The result starts as `output` (XLA aliases them; a copy where it did not); the table says
      // what each transfer moves.
      auto base = args.get<xla::ffi::AnyBuffer>(1);
      auto table = args.get<xla::ffi::AnyBuffer>(2);
      JR_REQUIRE(base.has_value() && table.has_value(), Code::kInvalidArgument, "jax_rccl '",
                 st.name, "': output or offsets table is not a buffer");
      JR_CHECK(B::Ragged(st, slot, call, leaves, *base, table->untyped_data()));
    }
    if (B::HasPlan(slot)) JR_CHECK(B::Run(st, slot, call, leaves));
    for (size_t i = 0; i < nLeaves; ++i) {
      if (slot.zeroAfter[i]) JR_CHECK(B::Zero(call, leaves.out(i), slot.leaves.outBytes[i]));
    }
    return Status::Ok();
  }
};

}  // namespace jax_rccl
