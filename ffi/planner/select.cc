// Choosing how a collective runs: derived sizes, the tuner hook, the algorithm and protocol, the
// channel and thread counts, the pattern and the device function. After the functions of the
// same names in RCCL rocm-6.2.0 src/enqueue.cc (ncclInfoSetDerived: src/include/info.h; the
// device function table: cmake/Generator.cmake), restricted to Ring and Tree, plus our Direct
// algorithm (ranks read each other's buffers in place; Simple only, on one node with
// topology.directPeers).
#include <algorithm>
#include <array>
#include <string>

#include "ffi/planner/internal.h"

namespace jax_rccl {
namespace {

constexpr uint32_t kAllAlgos = (1u << kNumAlgos) - 1;
constexpr uint32_t kAllProtos = (1u << kNumProtos) - 1;

bool ValidAlgo(Algo a) {
  return static_cast<int>(a) >= 0 && static_cast<int>(a) < kNumAlgos;
}
bool ValidProto(Proto p) {
  return static_cast<int>(p) >= 0 && static_cast<int>(p) < kNumProtos;
}
bool IsCostedColl(Coll c) {
  return static_cast<int>(c) >= 0 && static_cast<int>(c) < CostModel::kNumCostColls;
}

// "tree,ring" for a mask of algorithms (or protocols).
template <typename E>
std::string MaskNames(uint32_t mask, int n, const char* (*name)(E)) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (!(mask & (1u << i))) continue;
    if (!s.empty()) s += ",";
    s += name(static_cast<E>(i));
  }
  return s.empty() ? "none" : s;
}

// A choice fixed by the tuner must name a combination that exists.
Status CheckFixedChoice(const PlanContext& ctx, const CollInfo& info) {
  JR_REQUIRE(ValidAlgo(info.algo), Code::kInvalidArgument, "tuner: algorithm value ",
             static_cast<int>(info.algo), " for ", CollName(info.coll),
             " is out of range; allowed: tree, ring, direct");
  JR_REQUIRE(ValidProto(info.proto), Code::kInvalidArgument, "tuner: protocol value ",
             static_cast<int>(info.proto), " for ", CollName(info.coll),
             " is out of range; allowed: ll, ll128, simple");
  JR_REQUIRE(info.algo != Algo::kTree || info.coll == Coll::kAllReduce, Code::kInvalidArgument,
             "tuner: algorithm 'tree' cannot run ", CollName(info.coll), "; allowed: ring",
             ctx.topo.directPeers && ctx.topo.nNodes == 1 ? ", direct" : "");
  if (info.algo == Algo::kDirect) {
    JR_REQUIRE(ctx.topo.directPeers && ctx.topo.nNodes == 1, Code::kInvalidArgument,
               "tuner: algorithm 'direct' for ", CollName(info.coll),
               " needs one node whose ranks read each other's buffers (topology.directPeers "
               "true, nNodes 1; here directPeers ",
               ctx.topo.directPeers ? "true" : "false", ", nNodes ", ctx.topo.nNodes,
               "); allowed: ring", info.coll == Coll::kAllReduce ? ", tree" : "");
    JR_REQUIRE(info.proto == Proto::kSimple, Code::kInvalidArgument,
               "tuner: algorithm 'direct' runs protocol 'simple' only, not '",
               ProtoName(info.proto), "'; allowed: simple");
  }
  JR_REQUIRE(info.proto != Proto::kLL128 || ctx.topo.ll128Enabled, Code::kInvalidArgument,
             "tuner: protocol 'll128' for ", CollName(info.coll),
             " is not enabled on this topology (ll128Enabled is false); allowed: ll, simple");
  return Status::Ok();
}

// The device function space (after RCCL's cmake/Generator.cmake): collectives in the
// generator's order (all_gather, all_reduce, broadcast, reduce, reduce_scatter), then algorithm,
// protocol, device op and data type, type varying fastest. Only existing combinations get an id:
//   all_gather, broadcast:    Ring, every protocol, Sum, int8 (their data moves as bytes; any
//                             op and type maps to that function, as in RCCL)
//   all_reduce:               Tree and Ring, every protocol, every op and type
//   reduce, reduce_scatter:   Ring, every protocol, every op and type
// minus SumPostDiv on floating types (a float average is a PreMulSum). Our Direct functions
// come after all of RCCL's (so the Tree/Ring ids keep RCCL's generator order), in the same
// collective/op/type order, Simple only:
//   all_gather, broadcast:    Direct, Simple, Sum, int8
//   all_reduce, reduce, reduce_scatter: Direct, Simple, every op and type
// Send/recv take one id after all of these.
constexpr int kNumCollFuncs = 5;
constexpr Coll kGeneratorOrder[kNumCollFuncs] = {
    Coll::kAllGather, Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kReduceScatter};

bool FuncExists(Coll coll, DevRedOp op, DataType t, Algo algo, Proto proto) {
  if (op == DevRedOp::kSumPostDiv && IsFloating(t)) return false;
  if (algo == Algo::kDirect && proto != Proto::kSimple) return false;
  const bool ringOrDirect = algo == Algo::kRing || algo == Algo::kDirect;
  switch (coll) {
    case Coll::kAllGather:
    case Coll::kBroadcast:
      return ringOrDirect && op == DevRedOp::kSum && t == DataType::kInt8;
    case Coll::kAllReduce:
      return true;
    case Coll::kReduce:
    case Coll::kReduceScatter:
      return ringOrDirect;
    default:
      return false;
  }
}

struct FuncTable {
  // [coll][op][type][algo][proto]; -1 where no function exists.
  int id[kNumCollFuncs][kNumDevRedOps][kNumDataTypes][kNumAlgos][kNumProtos];
  int count = 0;
  FuncTable() {
    for (auto& a : id)
      for (auto& b : a)
        for (auto& c : b)
          for (auto& d : c)
            for (int& e : d) e = -1;
    // RCCL's algorithms (Tree, Ring) first, then ours (Direct).
    const int directAlgo = static_cast<int>(Algo::kDirect);
    for (int pass = 0; pass < 2; ++pass) {
      for (Coll coll : kGeneratorOrder) {
        const int c = static_cast<int>(coll);
        for (int a = 0; a < kNumAlgos; ++a) {
          if ((a == directAlgo) != (pass == 1)) continue;
          for (int p = 0; p < kNumProtos; ++p) {
            for (int o = 0; o < kNumDevRedOps; ++o) {
              for (int t = 0; t < kNumDataTypes; ++t) {
                if (FuncExists(coll, static_cast<DevRedOp>(o), static_cast<DataType>(t),
                               static_cast<Algo>(a), static_cast<Proto>(p))) {
                  id[c][o][t][a][p] = count++;
                }
              }
            }
          }
        }
      }
    }
  }
};

const FuncTable& Funcs() {
  static const FuncTable table;
  return table;
}

}  // namespace

void SetDerived(CollInfo* info, int nRanks) {
  info->nBytes = info->workBytes =
      static_cast<int64_t>(info->count) * static_cast<int64_t>(DataTypeSize(info->dtype));
  // Gathers and broadcasts move bytes: their device functions exist for int8 only.
  if (info->coll == Coll::kAllGather || info->coll == Coll::kBroadcast) {
    info->count = static_cast<uint64_t>(info->workBytes);
    info->dtype = DataType::kInt8;
  }
  // The count of all_gather and reduce_scatter is per rank.
  if (info->coll == Coll::kAllGather || info->coll == Coll::kReduceScatter) info->nBytes *= nRanks;
  // Chunk and slice steps (src/include/collectives.h): ring-pipelined collectives use half and a
  // quarter of the connection FIFO; broadcast, reduce and point-to-point one step.
  const bool ringPipelined = info->coll == Coll::kAllReduce || info->coll == Coll::kAllGather ||
                             info->coll == Coll::kReduceScatter;
  info->chunkSteps = ringPipelined ? kSteps / 2 : 1;
  info->sliceSteps = ringPipelined ? kSteps / 4 : 1;
}

Status GetTunerInfo(const PlanContext& ctx, CollInfo* info, int numPipeOps) {
  info->algo = Algo::kUndef;
  info->proto = Proto::kUndef;
  info->nChannels = 0;
  if (ctx.tuning.tuner) {
    TunerQuery query{info->coll, static_cast<uint64_t>(info->nBytes), numPipeOps};
    TunerChoice choice;
    JR_CHECK(ctx.tuning.tuner(query, &choice));
    JR_REQUIRE(choice.algo == Algo::kUndef || ValidAlgo(choice.algo), Code::kInvalidArgument,
               "tuner: algorithm value ", static_cast<int>(choice.algo), " for ",
               CollName(info->coll), " is out of range; allowed: tree, ring, direct (or undef)");
    JR_REQUIRE(choice.proto == Proto::kUndef || ValidProto(choice.proto), Code::kInvalidArgument,
               "tuner: protocol value ", static_cast<int>(choice.proto), " for ",
               CollName(info->coll), " is out of range; allowed: ll, ll128, simple (or undef)");
    JR_REQUIRE(choice.nChannels >= 0 && choice.nChannels <= kMaxChannels, Code::kInvalidArgument,
               "tuner: nChannels ", choice.nChannels, " for ", CollName(info->coll),
               " is out of range; allowed: 0 (planner decides) to ", kMaxChannels);
    info->algo = choice.algo;
    info->proto = choice.proto;
    info->nChannels = choice.nChannels;
  }
  // The channel count is honoured only when the tuner fixed it; otherwise the scheduler sizes it.
  info->userTuned = info->nChannels != 0;
  return Status::Ok();
}

namespace {

// Why GetAlgoInfo fell back to Ring's backup: each allowed pair and why it cannot run.
std::string FallbackNote(const PlanContext& ctx, const CollInfo& info, Algo algo, Proto proto) {
  std::string why;
  for (int a = 0; a < kNumAlgos; ++a) {
    for (int p = 0; p < kNumProtos; ++p) {
      if (!(ctx.tuning.algoMask & (1u << a)) || !(ctx.tuning.protoMask & (1u << p))) continue;
      const std::string reason = UnavailableReason(
          ctx.model, ctx.topo, info.coll, static_cast<Algo>(a), static_cast<Proto>(p), info.nBytes);
      if (reason.empty()) continue;
      why += std::string(why.empty() ? "" : "; ") + AlgoName(static_cast<Algo>(a)) + "/" +
             ProtoName(static_cast<Proto>(p)) + ": " + reason;
    }
  }
  return std::string("no allowed algorithm/protocol can run ") + CollName(info.coll) + " here (" +
         why + "); " + AlgoName(algo) + "/" + ProtoName(proto) +
         " runs instead, the cost model's fallback";
}

}  // namespace

Status GetAlgoInfo(const PlanContext& ctx, CollInfo* info, int numPipeOps) {
  if (ctx.topo.nRanks == 1) {
    info->algo = Algo::kRing;
    info->proto = Proto::kSimple;
    return Status::Ok();
  }
  if (info->algo != Algo::kUndef && info->proto != Proto::kUndef) {
    // The tuner fixed both; RCCL keeps them (and so bypasses the masks).
    JR_CHECK(CheckFixedChoice(ctx, *info));
    return Status::Ok();
  }
  JR_REQUIRE(IsCostedColl(info->coll), Code::kInternal, "GetAlgoInfo: ", CollName(info->coll),
             " is not a collective the cost model covers");
  const uint32_t algoMask = ctx.tuning.algoMask;
  const uint32_t protoMask = ctx.tuning.protoMask;
  float minTime = 3600000000.0f;  // an hour, in us
  float backupMinTime = 3600000000.0f;
  Algo best = Algo::kUndef, backupAlgo = Algo::kUndef;
  Proto bestProto = Proto::kUndef, backupProto = Proto::kUndef;
  for (int a = 0; a < kNumAlgos; ++a) {
    for (int p = 0; p < kNumProtos; ++p) {
      const Algo algo = static_cast<Algo>(a);
      const Proto proto = static_cast<Proto>(p);
      // NCCL zeroes the bandwidth of a combination NCCL_ALGO/NCCL_PROTO disable; a zeroed Ring
      // is still costed as a backup on its original bandwidth, a zeroed Tree is gone.
      const bool masked = !(algoMask & (1u << a)) || !(protoMask & (1u << p));
      if (proto == Proto::kLL128 && !ctx.topo.ll128Enabled) continue;
      if (masked && algo != Algo::kRing) continue;
      bool backup = false;
      const float time = AlgoTime(ctx.model, ctx.topo, info->coll, algo, proto, info->nBytes,
                                  numPipeOps, &backup, info->nChannels);
      if (masked) backup = true;
      if (time < 0) continue;
      if (!backup) {
        if (time < minTime) {
          best = algo;
          bestProto = proto;
          minTime = time;
        }
      } else if (time < backupMinTime) {
        backupAlgo = algo;
        backupProto = proto;
        backupMinTime = time;
      }
    }
  }
  if (best == Algo::kUndef || bestProto == Proto::kUndef) {
    JR_REQUIRE(
        backupAlgo != Algo::kUndef && backupProto != Proto::kUndef, Code::kInvalidUsage,
        "no algorithm/protocol available for ", CollName(info->coll), " of ", info->nBytes,
        " bytes (algorithms allowed: ", MaskNames<Algo>(algoMask & kAllAlgos, kNumAlgos, AlgoName),
        "; protocols allowed: ", MaskNames<Proto>(protoMask & kAllProtos, kNumProtos, ProtoName),
        "; LL128 ", ctx.topo.ll128Enabled ? "enabled" : "not enabled", ")");
    best = backupAlgo;
    bestProto = backupProto;
    minTime = backupMinTime;
    info->choiceNote = FallbackNote(ctx, *info, best, bestProto);
  }
  info->algo = best;
  info->proto = bestProto;
  info->predictedUs = minTime;
  return Status::Ok();
}

Status GetChannelThreadInfo(const PlanContext& ctx, CollInfo* info) {
  JR_REQUIRE(ValidAlgo(info->algo) && ValidProto(info->proto), Code::kInternal,
             "GetChannelThreadInfo: no algorithm/protocol chosen for ", CollName(info->coll));
  const TopologyView& topo = ctx.topo;
  // Direct takes Ring's channel and thread logic (the cost model copies Ring's thread counts and
  // thresholds to Direct): the same channel shrinking, and on NVIDIA-shaped archs the same sync
  // warp for Simple. Its channels split the data as Ring's do; no FIFO connects them.
  const Algo threadAlgo = info->algo == Algo::kDirect ? Algo::kRing : info->algo;
  const int a = static_cast<int>(threadAlgo);
  const int p = static_cast<int>(info->proto);
  const bool amd = IsAmd(topo.arch);
  int nc = info->nChannels > 0 ? info->nChannels : topo.nChannels;
  int nt = ctx.model.maxThreads[a][p];
  const int64_t threadThreshold = ctx.model.threadThresholds[a][p];
  // Fewer channels (and, on NVIDIA, fewer threads) until each thread has enough bytes.
  while (info->nBytes < static_cast<int64_t>(nc) * nt * threadThreshold) {
    if (nc >= 2) {
      --nc;
    } else if (!amd && nt % 128 == 0) {
      nt /= 2;
    } else {
      break;
    }
  }
  if (!amd) {
    // NVIDIA's Simple kernels add a sync warp (Ring) or split-thread warps (Tree); never fewer
    // than three warps. RCCL's HIP path does neither.
    const int ws = topo.warpSize();
    if (info->proto == Proto::kSimple) {
      if (threadAlgo == Algo::kRing) nt += ws;
      if (threadAlgo == Algo::kTree) nt += 4 * ws;
    }
    if (nt / ws < 3) nt = 3 * ws;
  }
  // The pivot and treeDefined rules below are RCCL's AMD topology rules for Ring/Tree; they never
  // override a Direct choice (the cost model offers Direct only where ranks share buffers).
  const bool direct = info->algo == Algo::kDirect;
  if (info->coll == Coll::kAllReduce && topo.pivotA2ANumBiRings == 3 && !direct) {
    // MI250X's pivot topology: RCCL's own all_reduce rule unless the user steered the choice.
    const bool userTuned = (ctx.tuning.algoMask & kAllAlgos) != kAllAlgos ||
                           (ctx.tuning.protoMask & kAllProtos) != kAllProtos ||
                           static_cast<bool>(ctx.tuning.tuner);
    info->nChannels = nc;
    if (!userTuned) {
      const Algo costed = info->algo;
      const Proto costedProto = info->proto;
      if (info->nBytes <= 2200008) {
        info->proto = Proto::kLL;
        info->algo = Algo::kTree;
        info->nChannels = std::min(24, topo.nChannels);
      } else {
        info->proto = Proto::kSimple;
        info->algo = Algo::kRing;
      }
      if (info->algo != costed || info->proto != costedProto) {
        info->choiceNote = std::string("RCCL's all_reduce rule for the MI250X pivot topology (") +
                           "tree/ll up to 2200008 bytes, else ring/simple) replaces the cost " +
                           "model's " + AlgoName(costed) + "/" + ProtoName(costedProto);
      }
    }
  } else if (info->coll == Coll::kAllReduce && topo.treeDefined && !direct &&
             (ctx.tuning.algoMask & (1u << static_cast<int>(Algo::kTree)))) {
    // The topology file's tree serves all_reduce. Unlike RCCL, not when the algorithm mask
    // excludes Tree: a forced algorithm holds.
    if (info->algo != Algo::kTree) {
      info->choiceNote = std::string("the topology's tree serves all_reduce (RCCL's rule for a ") +
                         "topology file with trees), replacing the cost model's " +
                         AlgoName(info->algo);
    }
    info->algo = Algo::kTree;
    info->nChannels = nc;
  } else {
    info->nChannels = nc;
  }
  info->nThreads = nt;
  return Status::Ok();
}

Status GetPatternInfo(CollInfo* info) {
  const bool tree = info->algo == Algo::kTree;
  if (info->algo == Algo::kDirect && IsCostedColl(info->coll)) {
    info->pattern = Pattern::kDirect;  // ranks read and write each other's buffers in place
    return Status::Ok();
  }
  switch (info->coll) {
    case Coll::kBroadcast:
      info->pattern = tree ? Pattern::kTreeDown : Pattern::kPipelineFrom;
      break;
    case Coll::kReduce:
      info->pattern = tree ? Pattern::kTreeUp : Pattern::kPipelineTo;
      break;
    case Coll::kReduceScatter:
    case Coll::kAllGather:
      info->pattern = Pattern::kRing;
      break;
    case Coll::kAllReduce:
      info->pattern = tree ? Pattern::kTreeUpDown : Pattern::kRingTwice;
      break;
    default:
      JR_FAIL(Code::kInternal, "GetPatternInfo: no pattern for ", CollName(info->coll),
              " with algorithm ", AlgoName(info->algo), "; allowed: broadcast, reduce, ",
              "all_gather, reduce_scatter, all_reduce");
  }
  return Status::Ok();
}

int DevFuncId(Coll coll, DevRedOp op, DataType dtype, Algo algo, Proto proto) {
  const int c = static_cast<int>(coll);
  int o = static_cast<int>(op);
  int t = static_cast<int>(dtype);
  if (!IsCostedColl(coll) || o < 0 || o >= kNumDevRedOps || t < 0 || t >= kNumDataTypes ||
      !ValidAlgo(algo) || !ValidProto(proto)) {
    return -1;
  }
  // Gathers and broadcasts copy bytes: like RCCL's ncclDevFuncId, their id ignores the op and the
  // data type (one function per protocol).
  if (coll == Coll::kAllGather || coll == Coll::kBroadcast) {
    o = static_cast<int>(DevRedOp::kSum);
    t = static_cast<int>(DataType::kInt8);
  }
  return Funcs().id[c][o][t][static_cast<int>(algo)][static_cast<int>(proto)];
}

int DevFuncIdP2p() {
  return Funcs().count;
}

int NumDevFuncs() {
  return Funcs().count + 1;
}

Status ComputeWorkFunc(CollInfo* info) {
  info->funcIndex = DevFuncId(info->coll, info->opFull.op, info->dtype, info->algo, info->proto);
  JR_REQUIRE(info->funcIndex >= 0, Code::kInvalidUsage, "no device function for ",
             CollName(info->coll), " with op ", DevRedOpName(info->opFull.op), ", dtype ",
             DataTypeName(info->dtype), ", algorithm ", AlgoName(info->algo), ", protocol ",
             ProtoName(info->proto));
  return Status::Ok();
}

}  // namespace jax_rccl
