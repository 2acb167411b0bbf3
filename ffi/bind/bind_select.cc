// Test entry points of the cost model and of the algorithm/protocol selection, under
// jax_rccl._jax_rccl.internal: cost_model, describe_cost_model, algo_time, unavailable_reason,
// select, dev_func_id, dev_func_id_p2p, num_dev_funcs, parse_algo_mask, parse_proto_mask.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/planner/cost_model.h"
#include "ffi/planner/internal.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

TopologyView TopoFromDict(const nb::dict& d) {
  return TopologyFromDict(d);
}

StatusOr<DevRedOp> ParseDevRedOp(const std::string& s) {
  for (int i = 0; i < kNumDevRedOps; ++i) {
    if (s == DevRedOpName(static_cast<DevRedOp>(i))) return static_cast<DevRedOp>(i);
  }
  return Status(Code::kInvalidArgument, "devop: unknown value '" + s +
                                            "'; allowed: sum, prod, minmax, premulsum, sumpostdiv");
}

nb::dict CostModelDict(const CostModel& m, const TopologyView& topo) {
  nb::dict lat, bw, backup, threads, thresholds;
  for (int c = 0; c < CostModel::kNumCostColls; ++c) {
    nb::dict latC, bwC, backupC;
    for (int a = 0; a < kNumAlgos; ++a) {
      nb::dict latA, bwA;
      for (int p = 0; p < kNumProtos; ++p) {
        const char* pn = ProtoName(static_cast<Proto>(p));
        latA[pn] = nb::float_(m.latencyUs[c][a][p]);
        bwA[pn] = nb::float_(m.bandwidthGBs[c][a][p]);
      }
      latC[AlgoName(static_cast<Algo>(a))] = latA;
      bwC[AlgoName(static_cast<Algo>(a))] = bwA;
    }
    for (int p = 0; p < kNumProtos; ++p) {
      backupC[ProtoName(static_cast<Proto>(p))] = nb::float_(m.ringBackupGBs[c][p]);
    }
    const char* cn = CollName(static_cast<Coll>(c));
    lat[cn] = latC;
    bw[cn] = bwC;
    backup[cn] = backupC;
  }
  for (int a = 0; a < kNumAlgos; ++a) {
    nb::dict t, th;
    for (int p = 0; p < kNumProtos; ++p) {
      const char* pn = ProtoName(static_cast<Proto>(p));
      t[pn] = nb::int_(m.maxThreads[a][p]);
      th[pn] = nb::int_(m.threadThresholds[a][p]);
    }
    threads[AlgoName(static_cast<Algo>(a))] = t;
    thresholds[AlgoName(static_cast<Algo>(a))] = th;
  }
  nb::dict out;
  out["latency_us"] = lat;
  out["bandwidth_gbs"] = bw;
  out["ring_backup_gbs"] = backup;
  out["max_threads"] = threads;
  out["thread_thresholds"] = thresholds;
  out["tree_depth"] = nb::int_(m.treeDepth);
  out["description"] = nb::str(DescribeCostModel(m, topo).c_str());
  return out;
}

}  // namespace

void BindSelectInternals(nb::module_& internal) {
  internal.def(
      "cost_model",
      [](const nb::dict& topology) {
        TopologyView topo = TopoFromDict(topology);
        return CostModelDict(ValueOrThrow(BuildCostModel(topo)), topo);
      },
      nb::arg("topology"),
      "The cost tables of a topology dict: latency_us / bandwidth_gbs [coll][algo][proto], "
      "ring_backup_gbs [coll][proto], max_threads / thread_thresholds [algo][proto], tree_depth.");

  internal.def(
      "algo_time",
      [](const nb::dict& topology, const std::string& coll, const std::string& algo,
         const std::string& proto, int64_t nbytes, int numPipeOps, int nChannels) {
        TopologyView topo = TopoFromDict(topology);
        CostModel model = ValueOrThrow(BuildCostModel(topo));
        bool backup = false;
        float t =
            AlgoTime(model, topo, ValueOrThrow(ParseColl(coll)), ValueOrThrow(ParseAlgo(algo)),
                     ValueOrThrow(ParseProto(proto)), nbytes, numPipeOps, &backup, nChannels);
        return nb::make_tuple(t, backup);
      },
      nb::arg("topology"), nb::arg("coll"), nb::arg("algorithm"), nb::arg("protocol"),
      nb::arg("nbytes"), nb::arg("num_pipe_ops") = 1, nb::arg("nchannels") = 0,
      "(microseconds, backup) of one operation; microseconds < 0 when it cannot run.");

  internal.def(
      "unavailable_reason",
      [](const nb::dict& topology, const std::string& coll, const std::string& algo,
         const std::string& proto, int64_t nbytes) {
        TopologyView topo = TopoFromDict(topology);
        CostModel model = ValueOrThrow(BuildCostModel(topo));
        return UnavailableReason(model, topo, ValueOrThrow(ParseColl(coll)),
                                 ValueOrThrow(ParseAlgo(algo)), ValueOrThrow(ParseProto(proto)),
                                 nbytes);
      },
      nb::arg("topology"), nb::arg("coll"), nb::arg("algorithm"), nb::arg("protocol"),
      nb::arg("nbytes"),
      "Why (algorithm, protocol) cannot run `nbytes` of `coll` on the topology, in a few words; "
      "empty when it can.");

  internal.def(
      "select",
      [](const nb::dict& topology, const std::string& coll, int64_t count, const std::string& dtype,
         const std::string& devop, const std::string& algorithm, const std::string& protocol,
         nb::object tuner, int numPipeOps) {
        TopologyView topo = TopoFromDict(topology);
        CostModel model = ValueOrThrow(BuildCostModel(topo));
        Tuning tuning;
        tuning.algoMask = ValueOrThrow(ParseAlgoMask(algorithm, "algorithm"));
        tuning.protoMask = ValueOrThrow(ParseProtoMask(protocol, "protocol"));
        if (!tuner.is_none()) tuning.tuner = WrapTuner(tuner);
        PlannerParams params;
        PlanContext ctx{topo, model, tuning, params, 0, 0};
        if (count < 0) throw nb::value_error("count: must be >= 0");
        CollInfo info;
        info.coll = ValueOrThrow(ParseColl(coll));
        info.count = static_cast<uint64_t>(count);
        info.dtype = ValueOrThrow(ParseDataType(dtype));
        info.opFull.op = ValueOrThrow(ParseDevRedOp(devop));
        SetDerived(&info, topo.nRanks);
        ThrowIfError(GetTunerInfo(ctx, &info, numPipeOps));
        ThrowIfError(GetAlgoInfo(ctx, &info, numPipeOps));
        ThrowIfError(GetChannelThreadInfo(ctx, &info));
        ThrowIfError(GetPatternInfo(&info));
        ThrowIfError(ComputeWorkFunc(&info));
        nb::dict d;
        d["coll"] = nb::str(CollName(info.coll));
        d["count"] = nb::int_(info.count);
        d["dtype"] = nb::str(DataTypeName(info.dtype));
        d["nbytes"] = nb::int_(info.nBytes);
        d["work_bytes"] = nb::int_(info.workBytes);
        d["chunk_steps"] = nb::int_(info.chunkSteps);
        d["slice_steps"] = nb::int_(info.sliceSteps);
        d["algorithm"] = nb::str(AlgoName(info.algo));
        d["protocol"] = nb::str(ProtoName(info.proto));
        d["nchannels"] = nb::int_(info.nChannels);
        d["nthreads"] = nb::int_(info.nThreads);
        d["pattern"] = nb::str(PatternName(info.pattern));
        d["func_index"] = nb::int_(info.funcIndex);
        d["user_tuned"] = nb::bool_(info.userTuned);
        d["predicted_us"] = nb::float_(info.predictedUs);
        d["choice_note"] = info.choiceNote.empty() ? nb::object(nb::none())
                                                   : nb::object(nb::str(info.choiceNote.c_str()));
        return d;
      },
      nb::arg("topology"), nb::arg("coll"), nb::arg("count"), nb::arg("dtype") = "float32",
      nb::arg("devop") = "sum", nb::arg("algorithm") = "", nb::arg("protocol") = "",
      nb::arg("tuner") = nb::none(), nb::arg("num_pipe_ops") = 1,
      "Runs SetDerived, GetTunerInfo, GetAlgoInfo, GetChannelThreadInfo, GetPatternInfo and "
      "ComputeWorkFunc on one collective; returns the resulting fields.");

  internal.def(
      "dev_func_id",
      [](const std::string& coll, const std::string& devop, const std::string& dtype,
         const std::string& algo, const std::string& proto) {
        return DevFuncId(ValueOrThrow(ParseColl(coll)), ValueOrThrow(ParseDevRedOp(devop)),
                         ValueOrThrow(ParseDataType(dtype)), ValueOrThrow(ParseAlgo(algo)),
                         ValueOrThrow(ParseProto(proto)));
      },
      nb::arg("coll"), nb::arg("devop"), nb::arg("dtype"), nb::arg("algorithm"),
      nb::arg("protocol"), "The device function index of a combination, or -1 if none exists.");
  internal.def("dev_func_id_p2p", &DevFuncIdP2p);
  internal.def("num_dev_funcs", &NumDevFuncs);

  // The two mask parsers: name, parser, the setting they read by default, doc.
  struct MaskParser {
    const char* name;
    StatusOr<uint32_t> (*parse)(const std::string&, const std::string&);
    const char* what;
    const char* doc;
  };
  for (const MaskParser& p : {
           MaskParser{"parse_algo_mask", ParseAlgoMask, "JAX_RCCL_ALGO",
                      "NCCL_ALGO syntax ('Ring', 'Tree,Ring', '^Tree') to a bit mask (bit 0 tree, "
                      "bit 1 ring, bit 2 direct)."},
           MaskParser{"parse_proto_mask", ParseProtoMask, "JAX_RCCL_PROTO",
                      "NCCL_PROTO syntax ('LL', 'LL,Simple', '^LL128') to a bit mask (bit 0 ll, 1 "
                      "ll128, 2 simple)."},
       }) {
    internal.def(
        p.name,
        [parse = p.parse](const std::string& spec, const std::string& what) {
          return ValueOrThrow(parse(spec, what));
        },
        nb::arg("spec"), nb::arg("what") = p.what, p.doc);
  }
}

}  // namespace jax_rccl
