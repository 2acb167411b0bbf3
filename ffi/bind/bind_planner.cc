// Python view of the planner: make_plan() over value dicts, the native Plan with to_dict() and
// its work layouts, a planning-time benchmark entry point, and the names the native side knows
// (reduction ops, dtypes, collective kinds), which the Python package takes from here.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/handlers/common.h"
#include "ffi/planner/planner.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

TaskDesc TaskFromDict(const nb::dict& d, size_t index) {
  TaskDesc t;
  auto field = [&](const char* k) -> nb::handle {
    return d.contains(k) ? nb::handle(d[k]) : nb::handle();
  };
  t.coll = ValueOrThrow(ParseColl(nb::cast<std::string>(d["coll"])));
  int64_t count = nb::cast<int64_t>(d["count"]);
  if (count < 0) {
    throw nb::value_error(
        ("tasks[" + std::to_string(index) + "]: count must be >= 0, got " + std::to_string(count))
            .c_str());
  }
  t.count = uint64_t(count);
  t.dtype = ValueOrThrow(ParseDataType(nb::cast<std::string>(d["dtype"])));
  if (nb::handle op = field("op"); op.is_valid() && !op.is_none()) {
    if (nb::isinstance<nb::int_>(op))
      t.op = nb::cast<int32_t>(op);
    else
      t.op = ValueOrThrow(ParseRedOp(nb::cast<std::string>(op)));
  }
  if (nb::handle r = field("root"); r.is_valid() && !r.is_none()) t.root = nb::cast<int>(r);
  if (nb::handle p = field("peer"); p.is_valid() && !p.is_none()) t.peer = nb::cast<int>(p);
  return t;
}

// Converts an element's count in planning units to the task's elements (all_gather and
// broadcast are planned in bytes, as RCCL does).
uint64_t ToTaskElems(const TaskPlan& tp, uint64_t planned) {
  const bool bytes = tp.coll == Coll::kAllGather || tp.coll == Coll::kBroadcast;
  return bytes ? planned / DataTypeSize(tp.dtype) : planned;
}

nb::dict WorkHeaderDict(const Work& w) {
  nb::dict h;
  h["type"] = int(w.header.type);
  h["func_index"] = int(w.header.funcIndex);
  h["is_last"] = bool(w.header.isLast);
  h["in_fifo"] = bool(w.header.inFifo);
  if (w.header.isLast)
    h["done_acks"] = w.header.doneAcks;
  else
    h["work_next"] = w.header.workNext;
  return h;
}

nb::list ElemDicts(const Plan& plan, const Work& w, int kernel, int workIx) {
  nb::list out;
  if (w.header.type == kWorkTypeColl) {
    for (int e = 0; e < kMaxWorkElements; ++e) {
      const WorkElemColl& el = w.elems[e];
      if (!el.isUsed) continue;
      const TaskPlan& tp = plan.tasks[el.slot];
      nb::dict d;
      d["type"] = "coll";
      d["kernel"] = kernel;
      d["work"] = workIx;
      d["task"] = int(el.slot);
      d["offset"] = ToTaskElems(tp, el.workOffset);
      d["count"] = ToTaskElems(tp, el.workCount);
      d["planned_offset"] = uint64_t(el.workOffset);
      d["planned_count"] = uint64_t(el.workCount);
      d["chunk_count"] = uint64_t(el.chunkCount);
      d["last_chunk_count"] = uint64_t(el.lastChunkCount);
      d["nwarps"] = int(el.nWarps);
      d["root"] = int(el.root);
      d["conn_index"] = int(el.connIndex);
      d["func_index"] = int(w.header.funcIndex);
      out.append(d);
    }
  } else if (w.header.type == kWorkTypeP2p) {
    for (int e = 0; e < kMaxWorkElementsP2p; ++e) {
      const WorkElemP2p& el = w.p2pElems[e];
      if (el.p2pType == kWorkP2pTypeUnused) continue;
      const TaskPlan& tp = plan.tasks[el.slot];
      const uint64_t off = (uint64_t(el.offsetHi) << 32) | el.offsetLo;
      const uint64_t bytes = (uint64_t(el.countHi) << 32) | el.countLo;
      const size_t es = DataTypeSize(tp.dtype);
      nb::dict d;
      d["type"] = el.p2pType == kWorkP2pTypeSend ? "send" : "recv";
      d["kernel"] = kernel;
      d["work"] = workIx;
      d["task"] = int(el.slot);
      d["peer"] = int(el.peer);
      d["offset"] = off / es;
      d["count"] = bytes / es;
      d["byte_offset"] = off;
      d["bytes"] = bytes;
      d["proto"] = ProtoName(Proto(el.proto & 3));  // a signed 2-bit field
      d["chunk_size"] = int(el.chunkSize);
      d["nwarps"] = int(el.nWarps);
      d["warp_start"] = int(el.warpStart);
      d["ngroups"] = int(el.ngroups);
      d["conn_index"] = int(el.connIndex);
      d["op_count"] = int(el.opCount);
      out.append(d);
    }
  }
  return out;
}

nb::list PeerList(int n, const int* peers) {
  nb::list out;
  for (int i = 0; i < n; ++i) out.append(peers[i]);
  return out;
}

nb::dict ProxyOpDict(const ProxyOp& op, int kernel) {
  nb::dict d;
  d["kernel"] = kernel;
  d["channel"] = op.channelId;
  d["task"] = op.task;
  d["coll"] = CollName(op.coll);
  d["pattern"] = PatternName(op.pattern);
  d["protocol"] = ProtoName(op.protocol);
  d["dtype"] = DataTypeName(op.dtype);
  d["red_op"] = RedOpName(op.redOp);
  d["root"] = op.root;
  d["peer"] = op.peer < 0 ? nb::object(nb::none()) : nb::object(nb::int_(op.peer));
  d["conn_index"] = op.connIndex;
  d["nsteps"] = op.nsteps;
  d["chunk_size"] = op.chunkSize;
  d["chunk_steps"] = op.chunkSteps;
  d["slice_steps"] = op.sliceSteps;
  d["nbytes"] = op.nbytes;
  d["op_count"] = op.opCount;
  d["recv_peers"] = PeerList(op.nRecvPeers, op.recvPeers);
  d["send_peers"] = PeerList(op.nSendPeers, op.sendPeers);
  return d;
}

nb::dict PlanToDict(const Plan& plan) {
  nb::dict out;
  out["rank"] = plan.rank;
  out["nranks"] = plan.nRanks;
  out["one_rank"] = plan.oneRank;
  nb::list tasks;
  for (const TaskPlan& tp : plan.tasks) {
    nb::dict d;
    const bool p2p = tp.coll == Coll::kSend || tp.coll == Coll::kRecv;
    d["index"] = tp.index;
    d["coll"] = CollName(tp.coll);
    d["dtype"] = DataTypeName(tp.dtype);
    d["count"] = tp.count;
    d["op"] = RedOpName(tp.op);
    d["op_handle"] = tp.op;
    d["dev_op"] = p2p ? nb::object(nb::none()) : nb::object(nb::str(DevRedOpName(tp.opFull.op)));
    d["scalar_arg"] = tp.opFull.scalarArg;
    d["scalar_arg_is_ptr"] = tp.opFull.scalarArgIsPtr;
    d["root"] = tp.root;
    d["peer"] = p2p ? nb::object(nb::int_(tp.peer)) : nb::object(nb::none());
    d["nbytes"] = tp.nBytes;
    d["algorithm"] = (p2p || tp.algo == Algo::kUndef) ? nb::object(nb::none())
                                                      : nb::object(nb::str(AlgoName(tp.algo)));
    d["protocol"] = tp.proto == Proto::kUndef ? nb::object(nb::none())
                                              : nb::object(nb::str(ProtoName(tp.proto)));
    d["pattern"] = PatternName(tp.pattern);
    d["nchannels"] = tp.nChannels;
    d["nthreads"] = tp.nThreads;
    d["chunk_size"] = tp.chunkSize;
    d["chunk_count"] = tp.chunkCount;
    d["chunk_steps"] = tp.chunkSteps;
    d["slice_steps"] = tp.sliceSteps;
    d["step_size"] = tp.stepSize;
    d["func_index"] = tp.funcIndex;
    d["user_tuned"] = tp.userTuned;
    d["agg_bytes"] = tp.aggBytes;
    d["predicted_us"] = tp.predictedUs;
    d["choice_note"] =
        tp.choiceNote.empty() ? nb::object(nb::none()) : nb::object(nb::str(tp.choiceNote.c_str()));
    d["kernel"] = tp.kernel;
    tasks.append(d);
  }
  out["tasks"] = tasks;

  // Channels: every work element of every kernel, grouped by channel id, in launch order.
  std::vector<nb::list> perChannel(kMaxChannels);
  nb::list kernels;
  for (size_t k = 0; k < plan.kernels.size(); ++k) {
    const KernelPlan& kp = plan.kernels[k];
    nb::dict kd;
    kd["index"] = int(k);
    kd["channel_count"] = kp.channelCount;
    kd["channel_ubound"] = kp.channelUbound;
    kd["channel_mask"] = nb::make_tuple(kp.channelMask.masks[0], kp.channelMask.masks[1]);
    kd["threads_per_block"] = kp.threadPerBlock;
    kd["max_bytes_per_channel"] = kp.maxBytesPerChannel;
    kd["nwork"] = kp.nWork();
    nb::list chans;
    for (int c = 0; c < kp.channelUbound; ++c) {
      const ChannelPlan& ch = kp.channels[c];
      if (ch.works.empty()) continue;
      nb::dict cd;
      cd["id"] = c;
      cd["nwork"] = ch.nWork();
      cd["coll_bytes"] = ch.collBytes;
      nb::list works;
      for (int w = 0; w < ch.nWork(); ++w) {
        nb::dict wd = WorkHeaderDict(ch.works[w]);
        nb::list elems = ElemDicts(plan, ch.works[w], int(k), w);
        wd["elems"] = elems;
        works.append(wd);
        for (nb::handle e : elems) perChannel[c].append(e);
      }
      cd["works"] = works;
      chans.append(cd);
    }
    kd["channels"] = chans;
    kernels.append(kd);
  }
  // One rank: each collective is a plain copy (or a PreMulSum scaling), shown on channel 0.
  if (plan.oneRank) {
    for (const TaskPlan& tp : plan.tasks) {
      if (tp.coll == Coll::kSend || tp.coll == Coll::kRecv || tp.count == 0) continue;
      nb::dict d;
      d["type"] = "copy";
      d["kernel"] = -1;
      d["work"] = 0;
      d["task"] = tp.index;
      d["offset"] = 0;
      d["count"] = tp.count;
      perChannel[0].append(d);
    }
  }
  nb::list channels;
  for (int c = 0; c < kMaxChannels; ++c) {
    if (perChannel[c].size() == 0) continue;
    nb::dict cd;
    cd["id"] = c;
    cd["work"] = perChannel[c];
    channels.append(cd);
  }
  out["channels"] = channels;
  out["kernels"] = kernels;
  // Every kernel's proxy ops, kernel by kernel in launch order, each in upload order.
  nb::list proxyOps;
  for (size_t k = 0; k < plan.kernels.size(); ++k) {
    for (const ProxyOp& op : ProxyOpsInUploadOrder(plan.kernels[k])) {
      proxyOps.append(ProxyOpDict(op, int(k)));
    }
  }
  out["proxy_ops"] = proxyOps;
  return out;
}

nb::list WorksToList(const Plan& plan, const std::vector<Work>& works) {
  nb::list out;
  for (size_t i = 0; i < works.size(); ++i) {
    nb::dict wd = WorkHeaderDict(works[i]);
    wd["elems"] = ElemDicts(plan, works[i], -1, int(i));
    out.append(wd);
  }
  return out;
}

}  // namespace

PlanRequest MakeRequest(const nb::dict& topology, const nb::list& tasks, int rank,
                        const std::string& algo, const std::string& proto, nb::object tuner,
                        const RedOpTable* userOps, bool persistent, uint64_t opCount,
                        int64_t p2pLLThreshold) {
  PlanRequest req;
  req.topo = TopologyFromDict(topology);
  req.rank = rank;
  req.tasks.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    req.tasks.push_back(TaskFromDict(nb::cast<nb::dict>(tasks[i]), i));
  }
  req.tuning.algoMask = ValueOrThrow(ParseAlgoMask(algo, "algorithm (JAX_RCCL_ALGO)"));
  req.tuning.protoMask = ValueOrThrow(ParseProtoMask(proto, "protocol (JAX_RCCL_PROTO)"));
  if (!tuner.is_none()) req.tuning.tuner = WrapTuner(tuner);
  req.userOps = userOps;
  req.persistent = persistent;
  req.opCount = opCount;
  req.params.p2pLLThreshold = p2pLLThreshold;
  return req;
}

void BindPlanner(nb::module_& m) {
  m.attr("gpu_buff_sizes") = nb::make_tuple(kGpuBuffSizes[0], kGpuBuffSizes[1], kGpuBuffSizes[2]);
  nb::class_<Plan>(m, "NativePlan")
      .def("to_dict", &PlanToDict)
      .def_prop_ro("nkernels", [](const Plan& p) { return p.kernels.size(); })
      .def(
          "layout_persistent",
          [](const Plan& p, int k) {
            if (k < 0 || k >= int(p.kernels.size())) throw nb::index_error("kernel index");
            return WorksToList(p, LayoutPersistent(p.kernels[k]));
          },
          nb::arg("kernel"), "The persistent work array of one kernel (uploadWork).")
      .def(
          "layout_fifo",
          [](const Plan& p, int k, uint32_t depth, uint32_t sent) {
            if (k < 0 || k >= int(p.kernels.size())) throw nb::index_error("kernel index");
            FifoState fifo;
            fifo.depth = depth;
            fifo.sent = sent;
            fifo.ackdMin = sent;
            for (auto& c : fifo.channelSent) c = sent;
            FifoLayout l = ValueOrThrow(LayoutFifo(p.kernels[k], &fifo));
            nb::dict d;
            d["ix_head"] = l.ixHead;
            d["wait_acked"] = l.waitAcked;
            d["sent"] = fifo.sent;
            nb::list writes;
            for (auto& [slot, w] : l.writes) {
              nb::dict wd = WorkHeaderDict(w);
              wd["slot"] = slot;
              wd["elems"] = ElemDicts(p, w, k, -1);
              writes.append(wd);
            }
            d["writes"] = writes;
            return d;
          },
          nb::arg("kernel"), nb::arg("depth"), nb::arg("sent") = 0,
          "The FIFO placement of one kernel's works in a ring of `depth` slots after `sent`.")
      .def(
          "upload_proxy_ops",
          [](const Plan& p, int k, uint64_t collOpCount, std::vector<uint64_t> p2pOpCounts) {
            if (k < 0 || k >= int(p.kernels.size())) throw nb::index_error("kernel index");
            if (p2pOpCounts.size() > size_t(kMaxChannels)) {
              throw nb::value_error("p2p_op_counts: at most one counter per channel (128)");
            }
            ProxyOpCounters counters;
            counters.collOpCount = collOpCount;
            for (size_t c = 0; c < p2pOpCounts.size(); ++c) counters.p2pOpCount[c] = p2pOpCounts[c];
            nb::list ops;
            for (const ProxyOp& op : UploadProxyOps(p.kernels[k], &counters)) {
              ops.append(ProxyOpDict(op, k));
            }
            std::vector<uint64_t> p2p(counters.p2pOpCount, counters.p2pOpCount + kMaxChannels);
            nb::dict d;
            d["ops"] = ops;
            d["coll_op_count"] = counters.collOpCount;
            d["p2p_op_counts"] = p2p;
            return d;
          },
          nb::arg("kernel"), nb::arg("coll_op_count") = 0,
          nb::arg("p2p_op_counts") = std::vector<uint64_t>(),
          "One kernel's proxy ops as uploadProxyOps hands them over: opCounts moved past the "
          "communicator's counters (collectives, p2p per channel), and the counters after it.");

  // Read-only vocabularies, each in its native order (an op's index is its `op` attribute).
  m.def(
      "reduction_ops",
      []() {
        std::vector<std::string> out;
        for (int32_t op = 0; op < kNumRedOps; ++op) out.push_back(RedOpName(op));
        return out;
      },
      "The reduction op names the planner knows, in the order of their codes (sum, prod, ...).");
  m.def(
      "dtypes",
      []() {
        std::vector<std::string> out;
        for (int t = 0; t < kNumDataTypes; ++t) out.push_back(DataTypeName(DataType(t)));
        return out;
      },
      "The element type names the planner knows, in the order of their codes.");
  m.def(
      "collective_kinds",
      []() {
        std::vector<std::string> out;
#define JAX_RCCL_KIND_NAME(name, kind) out.push_back(KindName(Kind::k##kind));
        JAX_RCCL_FFI_KINDS(JAX_RCCL_KIND_NAME)
#undef JAX_RCCL_KIND_NAME
        return out;
      },
      "The collective kinds of the FFI contract: target jax_rccl_<kind> each, in enum order.");

  m.def(
      "validate_topology",
      [](const nb::dict& topology) { ThrowIfError(ValidateTopology(TopologyFromDict(topology))); },
      nb::arg("topology"),
      "Checks a topology dict by the planner's rules (ValidateTopology, the check MakePlan and "
      "the cost model make); raises ValueError naming the field.");
  m.def(
      "validate_ranks_and_nodes",
      [](int nRanks, int nNodes) { ThrowIfError(ValidateRanksAndNodes(nRanks, nNodes)); },
      nb::arg("nranks"), nb::arg("nnodes"),
      "ValidateTopology's rule for ranks and nodes alone (planner.Topology checks it when built).");

  m.def(
      "make_plan",
      [](const nb::dict& topology, const nb::list& tasks, int rank, const std::string& algo,
         const std::string& proto, nb::object tuner, const RedOpTable* userOps, bool persistent,
         uint64_t opCount, int64_t p2pLLThreshold) {
        PlanRequest req = MakeRequest(topology, tasks, rank, algo, proto, tuner, userOps,
                                      persistent, opCount, p2pLLThreshold);
        return ValueOrThrow(MakePlan(req));
      },
      nb::arg("topology"), nb::arg("tasks"), nb::arg("rank") = 0, nb::arg("algorithm") = "",
      nb::arg("protocol") = "", nb::arg("tuner") = nb::none(),
      nb::arg("user_ops").none() = nb::none(), nb::arg("persistent") = true,
      nb::arg("op_count") = 0, nb::arg("p2p_ll_threshold") = 16384);

  m.def(
      "bench_plan",
      [](const nb::dict& topology, const nb::list& tasks, int iters, const std::string& algo,
         const std::string& proto) {
        PlanRequest req =
            MakeRequest(topology, tasks, 0, algo, proto, nb::none(), nullptr, true, 0, 16384);
        ThrowIfError(MakePlan(req).status());
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          auto p = MakePlan(req);
          if (!p.ok()) ThrowIfError(p.status());
        }
        auto t1 = std::chrono::steady_clock::now();
        return std::chrono::duration<double>(t1 - t0).count() / iters;
      },
      nb::arg("topology"), nb::arg("tasks"), nb::arg("iters") = 10, nb::arg("algorithm") = "",
      nb::arg("protocol") = "", "Seconds per MakePlan call (validation, costing, scheduling).");
}

}  // namespace jax_rccl
