// The GPU runtime's XLA FFI handlers (platforms CUDA and ROCM; one source for both).
//
// The same seven targets and attributes as the CPU handlers (ffi/cpu/handlers.cc); the execute
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
// PreMulSum with a per-device scalar operand (premul == 2) is not supported on GPUs yet: the
// scalar lives in device memory that changes from call to call.
#include "ffi/gpu/handlers.h"

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

#include "ffi/cpu/comm.h"
#include "ffi/gpu/comm.h"
#include "ffi/gpu/device_ctl.h"
#include "ffi/params.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/redop.h"
#include "ffi/planner/status.h"
#include "ffi/planner/types.h"
#include "hip/runtime.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_rccl {
namespace gpu {
namespace {

enum class Kind : int {
  kAllReduce = 0,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kPpermute,
};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
    case Kind::kAllToAll:
      return "all_to_all";
    case Kind::kPpermute:
      return "ppermute";
  }
  return "?";
}

bool Reduces(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduceScatter || k == Kind::kReduce;
}

// The one place a Status becomes an ffi::Error.
ffi::Error ToFfiError(const Status& s) {
  if (s.ok()) return ffi::Error::Success();
  ffi::ErrorCode code = ffi::ErrorCode::kInternal;
  switch (s.code()) {
    case Code::kTimeout:
      code = ffi::ErrorCode::kDeadlineExceeded;
      break;
    case Code::kInvalidArgument:
    case Code::kInvalidUsage:
      code = ffi::ErrorCode::kInvalidArgument;
      break;
    case Code::kUnsupported:
      code = ffi::ErrorCode::kUnimplemented;
      break;
    default:
      break;
  }
  return ffi::Error(code, s.ToString());
}

StatusOr<DataType> FromFfiType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED:
      return DataType::kBool;
    case ffi::DataType::S8:
      return DataType::kInt8;
    case ffi::DataType::U8:
      return DataType::kUint8;
    case ffi::DataType::S16:
      return DataType::kInt16;
    case ffi::DataType::U16:
      return DataType::kUint16;
    case ffi::DataType::S32:
      return DataType::kInt32;
    case ffi::DataType::U32:
      return DataType::kUint32;
    case ffi::DataType::S64:
      return DataType::kInt64;
    case ffi::DataType::U64:
      return DataType::kUint64;
    case ffi::DataType::F16:
      return DataType::kFloat16;
    case ffi::DataType::BF16:
      return DataType::kBfloat16;
    case ffi::DataType::F32:
      return DataType::kFloat32;
    case ffi::DataType::F64:
      return DataType::kFloat64;
    default:
      JR_FAIL(Code::kInvalidArgument, "element type ", static_cast<int>(t),
              " is not supported; allowed: f16, bf16, f32, f64, i8, u8, i16, u16, i32, u32, i64, "
              "u64 (bool as u8, complex as float pairs)");
  }
}

// The bytes of `value` in `dtype` (the immediate PreMulSum scalar).
uint64_t ScalarBits(double value, DataType dtype) {
  if (IsFloating(dtype)) return FloatBits(value, dtype);
  uint64_t bits = 0;
  auto put = [&](auto v) { std::memcpy(&bits, &v, sizeof(v)); };
  switch (dtype) {
    case DataType::kInt8:
      put(static_cast<int8_t>(value));
      break;
    case DataType::kUint8:
      put(static_cast<uint8_t>(value));
      break;
    case DataType::kInt16:
      put(static_cast<int16_t>(value));
      break;
    case DataType::kUint16:
      put(static_cast<uint16_t>(value));
      break;
    case DataType::kInt32:
      put(static_cast<int32_t>(value));
      break;
    case DataType::kUint32:
      put(static_cast<uint32_t>(value));
      break;
    case DataType::kInt64:
      put(static_cast<int64_t>(value));
      break;
    case DataType::kUint64:
      put(static_cast<uint64_t>(value));
      break;
    default:
      break;
  }
  return bits;
}

// Where a task slot's buffers come from: byte offsets into a leaf's operand and result.
struct SlotSource {
  int leaf = 0;
  bool send = false;
  bool recv = false;
  size_t sendOffset = 0;
  size_t recvOffset = 0;
};

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
  std::vector<size_t> inBytes, outBytes;
  std::vector<DataType> leafTypes;
  std::vector<uint8_t> zeroBefore, zeroAfter;

  std::mutex launchMu;               // guards `scratch` (one launch of this slot at a time)
  std::vector<SlotPtrs> scratch;     // by task slot; sized at build (no allocation per call)
  std::vector<void*> inPtr, outPtr;  // by leaf; sized at build
};

constexpr int kMaxOrdinals = 64;

}  // namespace

// The state of one call site in one executable (shared by its devices).
struct GpuState {
  static ffi::TypeId id;
  Kind kind = Kind::kAllReduce;
  int32_t op = kSum;
  int premul = 0;
  double premulValue = 1.0;
  int root = 0;
  int groupSize = 1;
  std::vector<std::pair<int, int>> perm;  // (src, dst) ranks
  std::vector<std::vector<int64_t>> groups;
  Tuning tuning;
  PlannerParams plannerParams;
  Params params;
  int64_t callSite = 0;
  std::string name;
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
  st->kind = kind;
  st->name = name.empty() ? std::string(KindName(kind)) : std::string(name);
  st->callSite = callSite;
  const std::string& who = st->name;

  JR_REQUIRE(groupSize >= 1, Code::kInvalidArgument, "jax_rccl '", who,
             "': group_size must be >= 1, got ", groupSize);
  JR_REQUIRE(groups.size() > 0 && groups.size() % groupSize == 0, Code::kInvalidArgument,
             "jax_rccl '", who, "': replica_groups has ", groups.size(),
             " device ids, which is not a positive multiple of group_size ", groupSize);
  st->groupSize = static_cast<int>(groupSize);
  const int n = st->groupSize;
  for (size_t g = 0; g * groupSize < groups.size(); ++g) {
    std::vector<int64_t> devs(groups.begin() + g * groupSize, groups.begin() + (g + 1) * groupSize);
    for (int r = 0; r < n; ++r) {
      JR_REQUIRE(devs[r] >= 0, Code::kInvalidArgument, "jax_rccl '", who,
                 "': replica_groups holds device id ", devs[r], "; ids are >= 0");
      auto slot = std::make_unique<DeviceSlot>();
      slot->device = devs[r];
      slot->group = static_cast<int>(g);
      slot->rank = r;
      JR_REQUIRE(st->slots.emplace(devs[r], std::move(slot)).second, Code::kInvalidArgument,
                 "jax_rccl '", who, "': device ", devs[r],
                 " appears more than once in replica_groups");
    }
    st->groups.push_back(std::move(devs));
  }

  if (Reduces(kind)) {
    JR_REQUIRE(op >= 0 && op < kNumRedOps, Code::kInvalidArgument, "jax_rccl '", who, "': op ", op,
               " is not one of 0 (sum), 1 (prod), 2 (max), 3 (min), 4 (avg)");
    JR_REQUIRE(premul >= 0 && premul <= 2, Code::kInvalidArgument, "jax_rccl '", who, "': premul ",
               premul, " is not one of 0 (none), 1 (immediate), 2 (per device)");
    JR_REQUIRE(premul == 0 || op == kSum, Code::kInvalidArgument, "jax_rccl '", who, "': premul ",
               premul, " needs op 0 (sum), got op ", op);
    JR_REQUIRE(premul != 2, Code::kUnsupported, "jax_rccl '", who,
               "': a per-device premul scalar (premul 2) is not supported on GPUs yet; use a "
               "Python number (premul 1) or scale before the collective");
    st->op = op;
    st->premul = premul;
  } else {
    JR_REQUIRE(premul == 0, Code::kInvalidArgument, "jax_rccl '", who, "': premul ", premul,
               " is only allowed for all_reduce, reduce_scatter and reduce");
    st->op = kSum;
  }
  st->premulValue = premulValue;

  if (kind == Kind::kBroadcast || kind == Kind::kReduce) {
    JR_REQUIRE(root >= 0 && root < n, Code::kInvalidArgument, "jax_rccl '", who, "': root ", root,
               " is not a rank of a group of ", n, " (0..", n - 1, ")");
    st->root = static_cast<int>(root);
  }

  if (kind == Kind::kPpermute) {
    JR_REQUIRE(perm.size() % 2 == 0, Code::kInvalidArgument, "jax_rccl '", who,
               "': perm must hold (src, dst) pairs; got ", perm.size(), " values");
    std::vector<uint8_t> srcSeen(n, 0), dstSeen(n, 0);
    for (size_t i = 0; i < perm.size(); i += 2) {
      const int64_t s = perm[i], d = perm[i + 1];
      JR_REQUIRE(s >= 0 && s < n && d >= 0 && d < n, Code::kInvalidArgument, "jax_rccl '", who,
                 "': perm pair (", s, ", ", d, ") names a rank outside 0..", n - 1);
      JR_REQUIRE(!srcSeen[s], Code::kInvalidArgument, "jax_rccl '", who, "': rank ", s,
                 " is the source of more than one perm pair");
      JR_REQUIRE(!dstSeen[d], Code::kInvalidArgument, "jax_rccl '", who, "': rank ", d,
                 " is the destination of more than one perm pair");
      srcSeen[s] = dstSeen[d] = 1;
      st->perm.emplace_back(static_cast<int>(s), static_cast<int>(d));
    }
  }

  std::vector<std::string> warnings;
  st->params = LoadParams(&warnings);
  const std::string algo = algorithm.empty() ? st->params.algo : std::string(algorithm);
  const std::string proto = protocol.empty() ? st->params.proto : std::string(protocol);
  JR_ASSIGN_OR_RETURN(st->tuning.algoMask,
                      ParseAlgoMask(algo, algorithm.empty() ? "JAX_RCCL_ALGO" : "algorithm"));
  JR_ASSIGN_OR_RETURN(st->tuning.protoMask,
                      ParseProtoMask(proto, protocol.empty() ? "JAX_RCCL_PROTO" : "protocol"));
  st->plannerParams.p2pLLThreshold = st->params.p2p_ll_threshold;
  return st;
}

// The task list of one device and where each task's buffers come from. On a group of one
// device, data movement to itself (all_to_all, ppermute (0, 0)) is a copy: a broadcast from
// rank 0, which the one-rank plan runs as a device copy.
Status MakeTasks(const GpuState& st, DeviceSlot& slot, std::vector<TaskDesc>* tasks) {
  const int n = st.groupSize;
  const int r = slot.rank;
  const size_t nLeaves = slot.leafTypes.size();
  slot.zeroBefore.assign(nLeaves, 0);
  slot.zeroAfter.assign(nLeaves, 0);
  for (size_t i = 0; i < nLeaves; ++i) {
    const DataType dt = slot.leafTypes[i];
    const size_t es = DataTypeSize(dt);
    const uint64_t inCount = slot.inBytes[i] / es;
    const uint64_t outCount = slot.outBytes[i] / es;
    auto add = [&](Coll coll, uint64_t count, int peer, bool send, bool recv, size_t sendOff,
                   size_t recvOff) {
      TaskDesc t;
      t.coll = coll;
      t.count = count;
      t.dtype = dt;
      t.op = st.op;
      t.root = coll == Coll::kBroadcast || coll == Coll::kReduce ? st.root : 0;
      t.peer = peer;
      tasks->push_back(t);
      SlotSource src;
      src.leaf = static_cast<int>(i);
      src.send = send;
      src.recv = recv;
      src.sendOffset = sendOff;
      src.recvOffset = recvOff;
      slot.sources.push_back(src);
    };
    switch (st.kind) {
      case Kind::kAllReduce:
      case Kind::kBroadcast:
      case Kind::kReduce:
        if (inCount > 0) {
          const Coll c = st.kind == Kind::kAllReduce
                             ? Coll::kAllReduce
                             : (st.kind == Kind::kBroadcast ? Coll::kBroadcast : Coll::kReduce);
          add(c, inCount, -1, true, true, 0, 0);
        }
        if (st.kind == Kind::kReduce && r != st.root) slot.zeroAfter[i] = 1;
        break;
      case Kind::kAllGather:
        if (inCount > 0) add(Coll::kAllGather, inCount, -1, true, true, 0, 0);
        break;
      case Kind::kReduceScatter:
        if (outCount > 0) add(Coll::kReduceScatter, outCount, -1, true, true, 0, 0);
        break;
      case Kind::kAllToAll: {
        const uint64_t block = inCount / n;
        if (block == 0) break;
        if (n == 1) {
          add(Coll::kBroadcast, inCount, -1, true, true, 0, 0);
          break;
        }
        for (int j = 0; j < n; ++j) {
          add(Coll::kSend, block, j, true, false, j * block * es, 0);
          add(Coll::kRecv, block, j, false, true, 0, j * block * es);
        }
        break;
      }
      case Kind::kPpermute: {
        bool hasSource = false;
        for (const auto& [s, d] : st.perm) {
          if (n == 1) {  // the only pair is (0, 0)
            hasSource = true;
            if (inCount > 0) add(Coll::kBroadcast, inCount, -1, true, true, 0, 0);
            continue;
          }
          if (s == r && inCount > 0) add(Coll::kSend, inCount, d, true, false, 0, 0);
          if (d == r) {
            hasSource = true;
            if (inCount > 0) add(Coll::kRecv, inCount, s, false, true, 0, 0);
          }
        }
        if (!hasSource) slot.zeroBefore[i] = 1;
        break;
      }
    }
  }
  return Status::Ok();
}

void LogPlan(const GpuState& st, int rank, const Plan& plan) {
  if (rank != 0 && st.params.debug != "TRACE") return;
  for (const TaskPlan& tp : plan.tasks) {
    std::fprintf(stderr,
                 "jax_rccl INFO %s (GPU): rank %d task %d %s %s x %llu: %s/%s, %d channel(s) x %d "
                 "threads, kernel %d\n",
                 st.name.c_str(), rank, tp.index, CollName(tp.coll), DataTypeName(tp.dtype),
                 static_cast<unsigned long long>(tp.count),
                 tp.coll == Coll::kSend || tp.coll == Coll::kRecv ? "p2p" : AlgoName(tp.algo),
                 ProtoName(tp.proto), tp.nChannels, tp.nThreads, tp.kernel);
  }
}

// Builds `slot`'s plan from the shapes of its first call, joins its communicator and uploads
// the plan to the slot's device.
Status BuildPlan(const GpuState& st, DeviceSlot& slot, const ffi::RemainingArgs& args,
                 const ffi::RemainingRets& rets) {
  const std::string& who = st.name;
  const int n = st.groupSize;
  const size_t nLeaves = rets.size();
  // One more operand may follow: the lowering's ordering operand (not read).
  JR_REQUIRE(args.size() == nLeaves || args.size() == nLeaves + 1, Code::kInvalidArgument,
             "jax_rccl '", who, "' (", KindName(st.kind), "): ", args.size(), " operands for ",
             nLeaves, " results; expected ", nLeaves, " and at most one ordering operand");
  JR_ASSIGN_OR_RETURN(slot.comm, GetOrCreateComm(st.groups[slot.group], st.params, who));

  for (size_t i = 0; i < nLeaves; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    JR_REQUIRE(in.has_value() && out.has_value(), Code::kInvalidArgument, "jax_rccl '", who,
               "': operand/result ", i, " is not a buffer");
    JR_REQUIRE(in->element_type() == (*out)->element_type(), Code::kInvalidArgument, "jax_rccl '",
               who, "': leaf ", i, " has operand type ", static_cast<int>(in->element_type()),
               " but result type ", static_cast<int>((*out)->element_type()));
    JR_ASSIGN_OR_RETURN(DataType dt, FromFfiType(in->element_type()));
    const size_t inCount = in->element_count(), outCount = (*out)->element_count();
    switch (st.kind) {
      case Kind::kAllGather:
        JR_REQUIRE(outCount == n * inCount, Code::kInvalidArgument, "jax_rccl '", who,
                   "' (all_gather): leaf ", i, " has ", inCount, " elements, so its result needs ",
                   n * inCount, " (group of ", n, "); got ", outCount);
        break;
      case Kind::kReduceScatter:
        JR_REQUIRE(inCount == n * outCount, Code::kInvalidArgument, "jax_rccl '", who,
                   "' (reduce_scatter): leaf ", i, " has ", inCount,
                   " elements; it needs group size ", n, " x result elements ", outCount);
        break;
      case Kind::kAllToAll:
        JR_REQUIRE(inCount == outCount && inCount % n == 0, Code::kInvalidArgument, "jax_rccl '",
                   who, "' (all_to_all): leaf ", i, " has ", inCount, " operand and ", outCount,
                   " result elements; both must be equal and a multiple of the group size ", n);
        break;
      default:
        JR_REQUIRE(inCount == outCount, Code::kInvalidArgument, "jax_rccl '", who, "' (",
                   KindName(st.kind), "): leaf ", i, " has ", inCount, " operand but ", outCount,
                   " result elements");
    }
    slot.leafTypes.push_back(dt);
    slot.inBytes.push_back(in->size_bytes());
    slot.outBytes.push_back((*out)->size_bytes());
  }
  slot.inPtr.assign(nLeaves, nullptr);
  slot.outPtr.assign(nLeaves, nullptr);

  std::vector<TaskDesc> tasks;
  JR_CHECK(MakeTasks(st, slot, &tasks));
  if (st.premul == 1) {
    for (TaskDesc& t : tasks) {
      if (t.coll != Coll::kAllReduce && t.coll != Coll::kReduceScatter && t.coll != Coll::kReduce) {
        continue;
      }
      const uint64_t bits = ScalarBits(st.premulValue, t.dtype);
      JR_ASSIGN_OR_RETURN(
          t.op, slot.userOps.CreatePreMulSum(&bits, t.dtype, ScalarResidence::kHostImmediate));
    }
  }
  slot.scratch.assign(tasks.size(), SlotPtrs{nullptr, nullptr});

  // Every rank joins, even one that moves nothing: the others' launches need its region.
  JR_CHECK(slot.comm->Join(slot.rank, who));
  if (tasks.empty()) {
    cpu::Stats().plansBuilt.fetch_add(1);
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
  if (st.params.debug == "INFO" || st.params.debug == "TRACE") LogPlan(st, slot.rank, plan);
  {
    RelaxedCapture relaxed;
    DeviceGuard guard(slot.ordinal);
    JR_CHECK(guard.status());
    StatusOr<std::unique_ptr<DevicePlan>> dp = DevicePlan::Upload(plan, slot.comm->geo());
    if (!dp.ok()) {
      Status s = dp.status();
      JR_STATUS_FRAME_(s);
      return Status(s.code(),
                    detail::StrCat("jax_rccl '", who, "' (", KindName(st.kind), ") on GPU group ",
                                   slot.comm->groupText(), ": ", s.ToString()));
    }
    slot.devPlan = dp.take();
  }
  cpu::Stats().plansBuilt.fetch_add(1);
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
  cpu::Stats().executions.fetch_add(1, std::memory_order_relaxed);

  const size_t nLeaves = slot.leafTypes.size();
  JR_REQUIRE(rets.size() == nLeaves, Code::kInvalidArgument, "jax_rccl '", st.name,
             "': called with ", rets.size(), " results; the plan has ", nLeaves);
  JR_CHECK(slot.comm->Check(slot.rank, st.name));
  JR_CHECK(EnsureDevice(ordinal));

  std::lock_guard<std::mutex> lock(slot.launchMu);
  for (size_t i = 0; i < nLeaves; ++i) {
    auto a = args.get<ffi::AnyBuffer>(i);
    auto b = rets.get<ffi::AnyBuffer>(i);
    JR_REQUIRE(a.has_value() && b.has_value() && a->size_bytes() == slot.inBytes[i] &&
                   (*b)->size_bytes() == slot.outBytes[i],
               Code::kInvalidArgument, "jax_rccl '", st.name, "': leaf ", i,
               " changed shape since the plan was built");
    slot.inPtr[i] = a->untyped_data();
    slot.outPtr[i] = (*b)->untyped_data();
    if (slot.zeroBefore[i]) {
      JR_CHECK(MemsetAsync(slot.outPtr[i], static_cast<int64_t>(slot.outBytes[i]), stream));
    }
  }
  if (slot.devPlan) {
    for (size_t t = 0; t < slot.sources.size(); ++t) {
      const SlotSource& s = slot.sources[t];
      slot.scratch[t].send =
          s.send ? static_cast<const char*>(slot.inPtr[s.leaf]) + s.sendOffset : nullptr;
      slot.scratch[t].recv =
          s.recv ? static_cast<char*>(slot.outPtr[s.leaf]) + s.recvOffset : nullptr;
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
      JR_CHECK(MemsetAsync(slot.outPtr[i], static_cast<int64_t>(slot.outBytes[i]), stream));
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
  try {
    StatusOr<std::unique_ptr<GpuState>> st =
        MakeState(K, groups, groupSize, op, premul, premulValue, root, perm, algorithm, protocol,
                  callSite, name);
    if (!st.ok()) return ffi::Unexpected(ToFfiError(st.status()));
    cpu::Stats().instantiations.fetch_add(1);
    return st.take();
  } catch (const std::exception& e) {
    return ffi::Unexpected(
        ffi::Error::Internal(std::string("jax_rccl GPU instantiate: ") + e.what()));
  } catch (...) {
    return ffi::Unexpected(ffi::Error::Internal("jax_rccl GPU instantiate: unknown exception"));
  }
}

ffi::Error ExecuteEntry(void* stream, int32_t ordinal, GpuState* st, ffi::RemainingArgs args,
                        ffi::RemainingRets rets) {
  try {
    if (st == nullptr) {
      return ffi::Error::Internal("jax_rccl GPU execute: no state (not instantiated)");
    }
    Status s = Execute(*st, stream, ordinal, args, rets);
    if (!s.ok()) cpu::Stats().errors.fetch_add(1);
    return ToFfiError(s);
  } catch (const std::exception& e) {
    cpu::Stats().errors.fetch_add(1);
    return ffi::Error::Internal(std::string("jax_rccl GPU execute: ") + e.what());
  } catch (...) {
    cpu::Stats().errors.fetch_add(1);
    return ffi::Error::Internal("jax_rccl GPU execute: unknown exception");
  }
}

auto InstantiateBinding() {
  return ffi::Ffi::BindInstantiate()
      .Attr<ffi::Span<const int64_t>>("replica_groups")
      .Attr<int64_t>("group_size")
      .Attr<int32_t>("op")
      .Attr<int32_t>("premul")
      .Attr<double>("premul_value")
      .Attr<int64_t>("root")
      .Attr<ffi::Span<const int64_t>>("perm")
      .Attr<std::string_view>("algorithm")
      .Attr<std::string_view>("protocol")
      .Attr<int64_t>("call_site")
      .Attr<std::string_view>("name");
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

#define JAX_RCCL_GPU_INSTANTIATE(kind)                                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_rccl_gpu_instantiate_##kind,                             \
                                jax_rccl::gpu::InstantiateFor<jax_rccl::gpu::Kind::k##kind>, \
                                jax_rccl::gpu::InstantiateBinding())
JAX_RCCL_GPU_INSTANTIATE(AllReduce);
JAX_RCCL_GPU_INSTANTIATE(AllGather);
JAX_RCCL_GPU_INSTANTIATE(ReduceScatter);
JAX_RCCL_GPU_INSTANTIATE(Broadcast);
JAX_RCCL_GPU_INSTANTIATE(Reduce);
JAX_RCCL_GPU_INSTANTIATE(AllToAll);
JAX_RCCL_GPU_INSTANTIATE(Ppermute);
#undef JAX_RCCL_GPU_INSTANTIATE

namespace jax_rccl {
namespace gpu {

const std::vector<cpu::FfiTarget>& GpuFfiTargets() {
  static const std::vector<cpu::FfiTarget> targets = {
#define JAX_RCCL_GPU_TARGET(name, kind)                                        \
  {"jax_rccl_" name, reinterpret_cast<void*>(jax_rccl_gpu_instantiate_##kind), \
   reinterpret_cast<void*>(jax_rccl_gpu_execute)}
      JAX_RCCL_GPU_TARGET("all_reduce", AllReduce),
      JAX_RCCL_GPU_TARGET("all_gather", AllGather),
      JAX_RCCL_GPU_TARGET("reduce_scatter", ReduceScatter),
      JAX_RCCL_GPU_TARGET("broadcast", Broadcast),
      JAX_RCCL_GPU_TARGET("reduce", Reduce),
      JAX_RCCL_GPU_TARGET("all_to_all", AllToAll),
      JAX_RCCL_GPU_TARGET("ppermute", Ppermute),
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
