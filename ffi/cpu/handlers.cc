// The CPU runtime's XLA FFI handlers.
//
// Every target shares one body: the kind (all_reduce, ..., ppermute) is a template argument of
// the instantiate stage and a field of the state; the execute stage is one handler for all.
//
// instantiate (once per executable, on a compile thread): parses and validates the attributes,
//   reads the parameters (ffi/params.h) and creates the state: one slot per device of the replica
//   groups, each with its rank and, later, its plan.
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
#include "ffi/cpu/handlers.h"

#include <atomic>
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

#include "ffi/cpu/comm.h"
#include "ffi/cpu/executor.h"
#include "ffi/params.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/redop.h"
#include "ffi/planner/status.h"
#include "ffi/planner/types.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_rccl {
namespace cpu {
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

// JAX_RCCL_DEBUG=INFO: one line per task of each plan built (rank 0 only, as NCCL's INFO).
template <typename State>
void LogPlan(const State& st, int rank, const Plan& plan) {
  if (rank != 0 && st.params.debug != "TRACE") return;
  for (const TaskPlan& tp : plan.tasks) {
    std::fprintf(stderr,
                 "jax_rccl INFO %s: rank %d task %d %s %s x %llu: %s/%s, %d channel(s) x %d "
                 "threads, kernel %d\n",
                 st.name.c_str(), rank, tp.index, CollName(tp.coll), DataTypeName(tp.dtype),
                 static_cast<unsigned long long>(tp.count),
                 tp.coll == Coll::kSend || tp.coll == Coll::kRecv ? "p2p" : AlgoName(tp.algo),
                 ProtoName(tp.proto), tp.nChannels, tp.nThreads, tp.kernel);
  }
}

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
  bool send = false;  // SlotBuffers::send = operand(leaf) + sendOffset
  bool recv = false;  // SlotBuffers::recv = result(leaf) + recvOffset
  size_t sendOffset = 0;
  size_t recvOffset = 0;
};

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
  std::vector<size_t> inBytes, outBytes;       // by leaf, as planned
  std::vector<DataType> leafTypes;             // by leaf
  std::vector<uint8_t> zeroBefore, zeroAfter;  // by leaf: outputs this rank zeroes
  std::unique_ptr<uint64_t[]> scalarCells;     // premul == 2: one per leaf
  uint64_t collFingerprint = 0, sendHash = 0, recvHash = 0;
  std::string tasksText;  // for messages across processes
};

}  // namespace

// The state of one call site in one executable (shared by all its devices; thread-safe: the
// fields are written at instantiate, the slots build their plans under their own mutexes).
struct CpuState {
  static ffi::TypeId id;
  int64_t instance = 0;  // unique per instantiation (part of the rendezvous key)
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
  double timeout = 300;
  int64_t callSite = 0;
  std::string name;
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
  st->timeout = st->params.timeout;
  const std::string algo = algorithm.empty() ? st->params.algo : std::string(algorithm);
  const std::string proto = protocol.empty() ? st->params.proto : std::string(protocol);
  JR_ASSIGN_OR_RETURN(st->tuning.algoMask,
                      ParseAlgoMask(algo, algorithm.empty() ? "JAX_RCCL_ALGO" : "algorithm"));
  JR_ASSIGN_OR_RETURN(st->tuning.protoMask,
                      ParseProtoMask(proto, protocol.empty() ? "JAX_RCCL_PROTO" : "protocol"));
  st->plannerParams.p2pLLThreshold = st->params.p2p_ll_threshold;
  return st;
}

// The task list of one device and where each task's buffers come from.
Status MakeTasks(const CpuState& st, DeviceSlot& slot, std::vector<TaskDesc>* tasks) {
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
      t.root = st.root;
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
        for (int j = 0; j < n; ++j) {
          add(Coll::kSend, block, j, true, false, j * block * es, 0);
          add(Coll::kRecv, block, j, false, true, 0, j * block * es);
        }
        break;
      }
      case Kind::kPpermute: {
        bool hasSource = false;
        for (const auto& [s, d] : st.perm) {
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

// Builds `slot`'s plan from the shapes of its first call.
Status BuildPlan(const CpuState& st, DeviceSlot& slot, const ffi::RemainingArgs& args,
                 const ffi::RemainingRets& rets) {
  const std::string& who = st.name;
  const int n = st.groupSize;
  const size_t nLeaves = rets.size();
  const size_t nOperands = st.premul == 2 ? 2 * nLeaves : nLeaves;
  // One more operand may follow: the lowering's ordering operand (a slice of the previous
  // collective's result, only there to keep collectives in program order); it is not read.
  JR_REQUIRE(args.size() == nOperands || args.size() == nOperands + 1, Code::kInvalidArgument,
             "jax_rccl '", who, "' (", KindName(st.kind), "): ", args.size(), " operands for ",
             nLeaves, " results; expected ", nOperands,
             st.premul == 2 ? " (the leaves, then one scalar per leaf)" : "",
             " and at most one ordering operand");
  JR_ASSIGN_OR_RETURN(slot.comm, World::Get().GetOrCreate(st.groups[slot.group], st.params));

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
    if (st.premul == 2) {
      auto scalar = args.get<ffi::AnyBuffer>(nLeaves + i);
      JR_REQUIRE(scalar.has_value() && scalar->element_count() == 1 &&
                     scalar->element_type() == in->element_type(),
                 Code::kInvalidArgument, "jax_rccl '", who, "': premul operand ", nLeaves + i,
                 " must be one element of leaf ", i, "'s type");
    }
    slot.leafTypes.push_back(dt);
    slot.inBytes.push_back(in->size_bytes());
    slot.outBytes.push_back((*out)->size_bytes());
  }

  std::vector<TaskDesc> tasks;
  JR_CHECK(MakeTasks(st, slot, &tasks));
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
    slot.tasksText = detail::StrCat(KindName(st.kind), ": nothing");
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
  if (st.params.debug == "INFO" || st.params.debug == "TRACE") LogPlan(st, slot.rank, plan);

  // What the other ranks check at the rendezvous (and, across processes, at the call site's
  // first use).
  CallFingerprint fp = FingerprintPlan(plan, static_cast<uint64_t>(st.kind));
  slot.sendHash = fp.send;
  slot.recvHash = fp.recv;
  slot.tasksText = detail::StrCat(KindName(st.kind), ": ", fp.text);
  slot.collFingerprint = fp.coll;
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
      slot.buildError = BuildPlan(st, slot, args, rets);
      slot.built.store(true, std::memory_order_release);
    }
  }
  const ExecKey key{st.instance, st.callSite, runId};
  if (!slot.buildError.ok()) {
    if (slot.comm != nullptr) {  // let the other ranks fail at once instead of at the deadline
      Arrival arrival;
      arrival.rank = slot.rank;
      arrival.error = slot.buildError;
      (void)slot.comm->Run(key, std::move(arrival), st.timeout, st.name,
                           [](const ExecContext&) { return Status::Ok(); });
    }
    Status s = slot.buildError;
    JR_STATUS_FRAME_(s);
    return s;
  }
  Stats().executions.fetch_add(1, std::memory_order_relaxed);

  const size_t nLeaves = slot.leafTypes.size();
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
    JR_REQUIRE(a.has_value() && b.has_value() && a->size_bytes() == slot.inBytes[i] &&
                   (*b)->size_bytes() == slot.outBytes[i],
               Code::kInvalidArgument, "jax_rccl '", st.name, "': leaf ", i,
               " changed shape since the plan was built");
    in[i] = a->untyped_data();
    out[i] = (*b)->untyped_data();
    if (st.params.huge_pages != 0) AdviseHugePages(out[i], slot.outBytes[i]);
    if (slot.zeroBefore[i]) std::memset(out[i], 0, slot.outBytes[i]);
  }
  if (slot.plan) {
    Arrival arrival;
    arrival.rank = slot.rank;
    arrival.collFingerprint = slot.collFingerprint;
    arrival.sendHash = slot.sendHash;
    arrival.recvHash = slot.recvHash;
    arrival.tasksText = &slot.tasksText;
    arrival.slots.resize(slot.sources.size());
    for (size_t t = 0; t < slot.sources.size(); ++t) {
      const SlotSource& s = slot.sources[t];
      if (s.send) arrival.slots[t].send = static_cast<const char*>(in[s.leaf]) + s.sendOffset;
      if (s.recv) arrival.slots[t].recv = static_cast<char*>(out[s.leaf]) + s.recvOffset;
    }
    const Plan& plan = *slot.plan;
    JR_CHECK(slot.comm->Run(
        key, std::move(arrival), st.timeout, st.name, [&](const ExecContext& ctx) -> Status {
          if (st.premul == 2) {
            for (size_t i = 0; i < nLeaves; ++i) {
              auto sc = args.get<ffi::AnyBuffer>(nLeaves + i);
              JR_REQUIRE(sc.has_value(), Code::kInvalidArgument, "jax_rccl '", st.name,
                         "': premul operand ", nLeaves + i, " is not a buffer");
              std::memcpy(&slot.scalarCells[i], sc->untyped_data(),
                          DataTypeSize(slot.leafTypes[i]));
            }
          }
          return ExecutePlan(plan, ctx);
        }));
  }
  for (size_t i = 0; i < nLeaves; ++i) {
    if (slot.zeroAfter[i]) std::memset(out[i], 0, slot.outBytes[i]);
  }
  return Status::Ok();
}

// ---- The FFI entry points ----

template <Kind K>
ffi::ErrorOr<std::unique_ptr<CpuState>> InstantiateFor(
    ffi::Span<const int64_t> groups, int64_t groupSize, int32_t op, int32_t premul,
    double premulValue, int64_t root, ffi::Span<const int64_t> perm, std::string_view algorithm,
    std::string_view protocol, int64_t callSite, std::string_view name) {
  try {
    StatusOr<std::unique_ptr<CpuState>> st =
        MakeState(K, groups, groupSize, op, premul, premulValue, root, perm, algorithm, protocol,
                  callSite, name);
    if (!st.ok()) return ffi::Unexpected(ToFfiError(st.status()));
    Stats().instantiations.fetch_add(1);
    return st.take();
  } catch (const std::exception& e) {
    return ffi::Unexpected(ffi::Error::Internal(std::string("jax_rccl instantiate: ") + e.what()));
  } catch (...) {
    return ffi::Unexpected(ffi::Error::Internal("jax_rccl instantiate: unknown exception"));
  }
}

ffi::Error ExecuteEntry(int32_t device, ffi::RunId runId, CpuState* st, ffi::RemainingArgs args,
                        ffi::RemainingRets rets) {
  try {
    if (st == nullptr) return ffi::Error::Internal("jax_rccl execute: no state (not instantiated)");
    Status s = Execute(*st, device, runId.run_id, args, rets);
    if (!s.ok()) Stats().errors.fetch_add(1);
    return ToFfiError(s);
  } catch (const std::exception& e) {
    Stats().errors.fetch_add(1);
    return ffi::Error::Internal(std::string("jax_rccl execute: ") + e.what());
  } catch (...) {
    Stats().errors.fetch_add(1);
    return ffi::Error::Internal("jax_rccl execute: unknown exception");
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

#define JAX_RCCL_CPU_INSTANTIATE(kind)                                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_rccl_cpu_instantiate_##kind,                             \
                                jax_rccl::cpu::InstantiateFor<jax_rccl::cpu::Kind::k##kind>, \
                                jax_rccl::cpu::InstantiateBinding())
JAX_RCCL_CPU_INSTANTIATE(AllReduce);
JAX_RCCL_CPU_INSTANTIATE(AllGather);
JAX_RCCL_CPU_INSTANTIATE(ReduceScatter);
JAX_RCCL_CPU_INSTANTIATE(Broadcast);
JAX_RCCL_CPU_INSTANTIATE(Reduce);
JAX_RCCL_CPU_INSTANTIATE(AllToAll);
JAX_RCCL_CPU_INSTANTIATE(Ppermute);
#undef JAX_RCCL_CPU_INSTANTIATE

namespace jax_rccl {
namespace cpu {

const std::vector<FfiTarget>& CpuFfiTargets() {
  static const std::vector<FfiTarget> targets = {
#define JAX_RCCL_CPU_TARGET(name, kind)                                        \
  {"jax_rccl_" name, reinterpret_cast<void*>(jax_rccl_cpu_instantiate_##kind), \
   reinterpret_cast<void*>(jax_rccl_cpu_execute)}
      JAX_RCCL_CPU_TARGET("all_reduce", AllReduce),
      JAX_RCCL_CPU_TARGET("all_gather", AllGather),
      JAX_RCCL_CPU_TARGET("reduce_scatter", ReduceScatter),
      JAX_RCCL_CPU_TARGET("broadcast", Broadcast),
      JAX_RCCL_CPU_TARGET("reduce", Reduce),
      JAX_RCCL_CPU_TARGET("all_to_all", AllToAll),
      JAX_RCCL_CPU_TARGET("ppermute", Ppermute),
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
