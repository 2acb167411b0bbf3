// See ffi/handlers/common.h.
#include "ffi/handlers/common.h"

#include <cstdio>
#include <cstring>
#include <set>

namespace jax_rccl {

namespace ffi = xla::ffi;

const char* KindName(Kind k) {
  switch (k) {
#define JAX_RCCL_KIND_NAME(name, kind) \
  case Kind::k##kind:                  \
    return name;
    JAX_RCCL_FFI_KINDS(JAX_RCCL_KIND_NAME)
#undef JAX_RCCL_KIND_NAME
  }
  return "?";
}

bool Reduces(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduceScatter || k == Kind::kReduce;
}

xla::ffi::Error ToFfiError(const Status& s) {
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
    case ffi::DataType::F8E4M3FN:
      return DataType::kFp8E4M3;
    case ffi::DataType::F8E5M2:
      return DataType::kFp8E5M2;
    default:
      JR_FAIL(Code::kInvalidArgument, "element type ", static_cast<int>(t),
              " is not supported; allowed: f8e4m3fn, f8e5m2, f16, bf16, f32, f64, i8, u8, i16, "
              "u16, i32, u32, i64, u64 (bool as u8, complex as float pairs)");
  }
}

Status ParseCallAttrs(Kind kind, ffi::Span<const int64_t> groups, int64_t groupSize, int32_t op,
                      int32_t premul, double premulValue, int64_t root,
                      ffi::Span<const int64_t> perm, std::string_view algorithm,
                      std::string_view protocol, int64_t callSite, std::string_view name,
                      CallAttrs* out) {
  out->kind = kind;
  out->name = name.empty() ? std::string(KindName(kind)) : std::string(name);
  out->callSite = callSite;
  const std::string& who = out->name;

  JR_REQUIRE(groupSize >= 1, Code::kInvalidArgument, "jax_rccl '", who,
             "': group_size must be >= 1, got ", groupSize);
  JR_REQUIRE(groups.size() > 0 && groups.size() % groupSize == 0, Code::kInvalidArgument,
             "jax_rccl '", who, "': replica_groups has ", groups.size(),
             " device ids, which is not a positive multiple of group_size ", groupSize);
  out->groupSize = static_cast<int>(groupSize);
  const int n = out->groupSize;
  // Rows of group_size ids; a group smaller than that ends in -1s (groups of unequal sizes,
  // all_reduce only).
  std::set<int64_t> seen;
  for (size_t g = 0; g * groupSize < groups.size(); ++g) {
    std::vector<int64_t> devs(groups.begin() + g * groupSize, groups.begin() + (g + 1) * groupSize);
    while (devs.size() > 1 && devs.back() == -1) devs.pop_back();
    JR_REQUIRE(static_cast<int>(devs.size()) == n || kind == Kind::kAllReduce,
               Code::kInvalidArgument, "jax_rccl '", who, "' (", KindName(kind), "): group ", g,
               " has ", devs.size(), " devices, the others ", n,
               "; groups of unequal sizes are supported by all_reduce only");
    for (int64_t d : devs) {
      JR_REQUIRE(d >= 0, Code::kInvalidArgument, "jax_rccl '", who,
                 "': replica_groups holds device id ", d,
                 "; ids are >= 0 (-1 only pads the end of a smaller group)");
      JR_REQUIRE(seen.insert(d).second, Code::kInvalidArgument, "jax_rccl '", who, "': device ", d,
                 " appears more than once in replica_groups");
    }
    out->groups.push_back(std::move(devs));
  }

  if (Reduces(kind)) {
    JR_REQUIRE(op >= 0 && op < kNumRedOps, Code::kInvalidArgument, "jax_rccl '", who, "': op ", op,
               " is not one of 0 (sum), 1 (prod), 2 (max), 3 (min), 4 (avg)");
    JR_REQUIRE(premul >= 0 && premul <= 2, Code::kInvalidArgument, "jax_rccl '", who, "': premul ",
               premul, " is not one of 0 (none), 1 (immediate), 2 (per device)");
    JR_REQUIRE(premul == 0 || op == kSum, Code::kInvalidArgument, "jax_rccl '", who, "': premul ",
               premul, " needs op 0 (sum), got op ", op);
    out->op = op;
    out->premul = premul;
  } else {
    JR_REQUIRE(premul == 0, Code::kInvalidArgument, "jax_rccl '", who, "': premul ", premul,
               " is only allowed for all_reduce, reduce_scatter and reduce");
    out->op = kSum;
  }
  out->premulValue = premulValue;

  if (kind == Kind::kBroadcast || kind == Kind::kReduce) {
    JR_REQUIRE(root >= 0 && root < n, Code::kInvalidArgument, "jax_rccl '", who, "': root ", root,
               " is not a rank of a group of ", n, " (0..", n - 1, ")");
    out->root = static_cast<int>(root);
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
      out->perm.emplace_back(static_cast<int>(s), static_cast<int>(d));
    }
  }

  JR_ASSIGN_OR_RETURN(out->params, LoadValidParams());
  const std::string algo = algorithm.empty() ? out->params.algo : std::string(algorithm);
  const std::string proto = protocol.empty() ? out->params.proto : std::string(protocol);
  JR_ASSIGN_OR_RETURN(out->tuning.algoMask,
                      ParseAlgoMask(algo, algorithm.empty() ? "jax_rccl: JAX_RCCL_ALGO"
                                                            : "jax_rccl.config: algorithm"));
  JR_ASSIGN_OR_RETURN(out->tuning.protoMask,
                      ParseProtoMask(proto, protocol.empty() ? "jax_rccl: JAX_RCCL_PROTO"
                                                             : "jax_rccl.config: protocol"));
  out->plannerParams.p2pLLThreshold = out->params.p2p_ll_threshold;
  return Status::Ok();
}

namespace {

// One attribute of the call's dictionary, or an error naming it.
template <typename T>
StatusOr<T> AttrOf(const ffi::Dictionary& attrs, const char* name) {
  JR_REQUIRE(attrs.contains(name), Code::kInvalidArgument, "the call has no attribute '", name,
             "' (a program lowered by another jax_rccl release?)");
  auto v = attrs.get<T>(name);
  JR_REQUIRE(v.has_value(), Code::kInvalidArgument, "attribute '", name,
             "' has the wrong type: ", v.error().message());
  return *v;
}

}  // namespace

Status DecodeCallAttrs(Kind kind, const ffi::Dictionary& attrs, CallAttrs* out) {
  int version = kOldestAbiVersion;
  if (attrs.contains("abi_version")) {
    JR_ASSIGN_OR_RETURN(int32_t v, AttrOf<int32_t>(attrs, "abi_version"));
    version = v;
  }
  JR_REQUIRE(version >= kOldestAbiVersion && version <= kAbiVersion, Code::kInvalidArgument,
             "this program's jax_rccl calls were lowered for contract version ", version,
             "; this jax_rccl runs versions ", kOldestAbiVersion, " to ", kAbiVersion,
             " (install the jax_rccl release that exported it, or a newer one)");
  // (JR_ASSIGN_OR_RETURN names its temporary by line, and these expand on one line.)
#define JR_READ_ATTR_(n, T)             \
  auto n##_read = AttrOf<T>(attrs, #n); \
  JR_CHECK(n##_read.status());          \
  T n = n##_read.take();
  JAX_RCCL_CALL_ATTRS(JR_READ_ATTR_)
#undef JR_READ_ATTR_
  out->abiVersion = version;
  out->protocolText = std::string(protocol);
  return ParseCallAttrs(kind, replica_groups, group_size, op, premul, premul_value, root, perm,
                        algorithm, protocol, call_site, name, out);
}

std::vector<std::string> CallAttributeNames() {
#define JR_NAME_ATTR_(n, T) #n,
  return {JAX_RCCL_CALL_ATTRS(JR_NAME_ATTR_) "abi_version"};
#undef JR_NAME_ATTR_
}

Status ReadLeaves(const CallAttrs& attrs, const ffi::RemainingArgs& args,
                  const ffi::RemainingRets& rets, Leaves* leaves) {
  const std::string& who = attrs.name;
  const int n = attrs.groupSize;
  const size_t nLeaves = rets.size();
  const size_t nOperands = attrs.premul == 2 ? 2 * nLeaves : nLeaves;
  // More operands may follow: a device check (jax.export, see DeviceCheckOperand), and the
  // lowering's ordering operand (a slice of the previous collective's result, only there to keep
  // collectives in program order), which is not read.
  const size_t extra = DeviceCheckOperand(attrs, args, nLeaves) >= 0 ? 1 : 0;
  JR_REQUIRE(args.size() == nOperands + extra || args.size() == nOperands + extra + 1,
             Code::kInvalidArgument, "jax_rccl '", who, "' (", KindName(attrs.kind),
             "): ", args.size(), " operands for ", nLeaves, " results; expected ", nOperands,
             attrs.premul == 2 ? " (the leaves, then one scalar per leaf)" : "",
             extra ? ", a device check" : "", " and at most one ordering operand");
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
    switch (attrs.kind) {
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
                   KindName(attrs.kind), "): leaf ", i, " has ", inCount, " operand but ", outCount,
                   " result elements");
    }
    if (attrs.premul == 2) {
      auto scalar = args.get<ffi::AnyBuffer>(nLeaves + i);
      JR_REQUIRE(scalar.has_value() && scalar->element_count() == 1 &&
                     scalar->element_type() == in->element_type(),
                 Code::kInvalidArgument, "jax_rccl '", who, "': premul operand ", nLeaves + i,
                 " must be one element of leaf ", i, "'s type");
    }
    leaves->types.push_back(dt);
    leaves->inBytes.push_back(in->size_bytes());
    leaves->outBytes.push_back((*out)->size_bytes());
  }

  return Status::Ok();
}

int DeviceCheckOperand(const CallAttrs& attrs, const ffi::RemainingArgs& args, size_t nLeaves) {
  if (attrs.kind == Kind::kRaggedAllToAll) return -1;  // its own operands (ffi/handlers/ragged.h)
  const size_t at = attrs.premul == 2 ? 2 * nLeaves : nLeaves;
  if (at >= args.size()) return -1;
  auto b = args.get<ffi::AnyBuffer>(at);
  if (!b.has_value() || b->element_type() != ffi::DataType::S64 || b->element_count() != 3) {
    return -1;
  }
  return static_cast<int>(at);
}

Status CheckDevice(const CallAttrs& attrs, const ffi::RemainingArgs& args, size_t nLeaves,
                   int64_t device) {
  const int at = DeviceCheckOperand(attrs, args, nLeaves);
  if (at < 0) return Status::Ok();
  int64_t v[3];
  std::memcpy(v, args.get<ffi::AnyBuffer>(at)->untyped_data(), sizeof(v));
  return CheckDeviceValues(attrs, v, at, device);
}

Status CheckDeviceValues(const CallAttrs& attrs, const int64_t v[3], int at, int64_t device) {
  JR_REQUIRE(v[0] == kDeviceCheckMagic, Code::kInvalidArgument, "jax_rccl '", attrs.name,
             "': operand ", at, " is three int64s but not a device check");
  JR_REQUIRE(v[2] == device, Code::kInvalidUsage, "jax_rccl '", attrs.name, "' (",
             KindName(attrs.kind), "): partition ", v[1], " runs on device ", device,
             " but the program was lowered with device ", v[2],
             " there: an exported program must be called on the devices of the mesh it was "
             "exported with, in the same mesh order (its replica groups name those devices)");
  return Status::Ok();
}

RankTasks MakeRankTasks(const CallAttrs& attrs, int rank, const Leaves& leaves,
                        bool oneRankCopies) {
  RankTasks rt;
  const int n = attrs.groupSize;
  const int r = rank;
  const size_t nLeaves = leaves.size();
  rt.zeroBefore.assign(nLeaves, 0);
  rt.zeroAfter.assign(nLeaves, 0);
  for (size_t i = 0; i < nLeaves; ++i) {
    const DataType dt = leaves.types[i];
    const size_t es = DataTypeSize(dt);
    const uint64_t inCount = leaves.inBytes[i] / es;
    const uint64_t outCount = leaves.outBytes[i] / es;
    auto add = [&](Coll coll, uint64_t count, int peer, bool send, bool recv, size_t sendOff,
                   size_t recvOff) {
      TaskDesc t;
      t.coll = coll;
      t.count = count;
      t.dtype = dt;
      t.op = attrs.op;
      t.root = attrs.root;
      t.peer = peer;
      rt.tasks.push_back(t);
      SlotSource src;
      src.leaf = static_cast<int>(i);
      src.send = send;
      src.recv = recv;
      src.sendOffset = sendOff;
      src.recvOffset = recvOff;
      rt.sources.push_back(src);
    };
    switch (attrs.kind) {
      case Kind::kAllReduce:
      case Kind::kBroadcast:
      case Kind::kReduce:
        if (inCount > 0) {
          const Coll c = attrs.kind == Kind::kAllReduce
                             ? Coll::kAllReduce
                             : (attrs.kind == Kind::kBroadcast ? Coll::kBroadcast : Coll::kReduce);
          add(c, inCount, -1, true, true, 0, 0);
        }
        if (attrs.kind == Kind::kReduce && r != attrs.root) rt.zeroAfter[i] = 1;
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
        if (n == 1 && oneRankCopies) {
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
        for (const auto& [s, d] : attrs.perm) {
          if (n == 1 && oneRankCopies) {  // the only pair is (0, 0)
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
        if (!hasSource) rt.zeroBefore[i] = 1;
        break;
      }
      case Kind::kRaggedAllToAll:  // ffi/handlers/ragged.cc: MakeRaggedTasks
        break;
    }
  }
  return rt;
}

void LogPlan(const CallAttrs& attrs, int rank, const Plan& plan, int nNodes, const char* where) {
  if (rank != 0 && attrs.params.debug != "TRACE") return;
  for (const TaskPlan& tp : plan.tasks) {
    std::fprintf(stderr,
                 "jax_rccl INFO %s%s: rank %d task %d %s %s x %llu: %s/%s, %d channel(s) x %d "
                 "threads, kernel %d, %d node(s)\n",
                 attrs.name.c_str(), where, rank, tp.index, CollName(tp.coll),
                 DataTypeName(tp.dtype), static_cast<unsigned long long>(tp.count),
                 tp.coll == Coll::kSend || tp.coll == Coll::kRecv ? "p2p" : AlgoName(tp.algo),
                 ProtoName(tp.proto), tp.nChannels, tp.nThreads, tp.kernel, nNodes);
  }
}

}  // namespace jax_rccl
