// The test-only module jax_rccl._jax_rccl_testing (its own copy of the runtime's state):
// - run_plan_threads plans a group for every rank of a topology, runs the ranks as threads of
//   this process over one host transport, and returns every rank's outputs
//   (tests/cpu/test_executor.py);
// - run_plan_process runs this process's ranks of a replica group through the runtime's real
//   communicator (World::GetOrCreate: with a world table whose group spans processes, the
//   shared-memory transport), without JAX (tests/multiprocess/test_shm_transport.py,
//   benchmarks/check_cost.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/comm/socket_listen.h"
#include "ffi/comm/world.h"
#include "ffi/core/params.h"
#include "ffi/cpu/comm.h"
#include "ffi/host/executor.h"
#include "ffi/planner/planner.h"
#include "ffi/planner/redop.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

using host::Clock;

// A reusable barrier with a deadline and an abort flag.
class TestBarrier {
 public:
  TestBarrier(int n, const std::atomic<bool>* aborted) : n_(n), aborted_(aborted) {}
  Status Wait(int rank, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return Status::Ok();
    }
    while (gen_ == gen) {
      if (aborted_->load()) {
        return Status(Code::kTimeout, "barrier: the run was aborted");
      }
      if (cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(5))) ==
              std::cv_status::timeout &&
          Clock::now() >= deadline && gen_ == gen) {
        return Status(Code::kTimeout, detail::StrCat("barrier: rank ", rank, " waited for ",
                                                     n_ - arrived_, " ranks that never arrived"));
      }
    }
    return Status::Ok();
  }
  void WakeAll() { cv_.notify_all(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  const std::atomic<bool>* aborted_;
};

struct TestTask {
  TaskDesc desc;
  std::vector<double> premul;  // per rank (one value: all ranks); empty: none
  bool premulDevice = false;
};

TestTask TaskFromDictTest(const nb::dict& d, size_t index) {
  TestTask t;
  t.desc.coll = ValueOrThrow(ParseColl(nb::cast<std::string>(d["coll"])));
  const int64_t count = nb::cast<int64_t>(d["count"]);
  if (count < 0) {
    throw nb::value_error(
        detail::StrCat("tasks[", index, "]: count must be >= 0, got ", count).c_str());
  }
  t.desc.count = uint64_t(count);
  t.desc.dtype = ValueOrThrow(ParseDataType(nb::cast<std::string>(d["dtype"])));
  if (d.contains("op") && !d["op"].is_none()) {
    nb::handle op = d["op"];
    t.desc.op = nb::isinstance<nb::int_>(op) ? nb::cast<int32_t>(op)
                                             : ValueOrThrow(ParseRedOp(nb::cast<std::string>(op)));
  }
  if (d.contains("root") && !d["root"].is_none()) t.desc.root = nb::cast<int>(d["root"]);
  if (d.contains("peer") && !d["peer"].is_none()) t.desc.peer = nb::cast<int>(d["peer"]);
  if (d.contains("premul") && !d["premul"].is_none()) {
    nb::handle p = d["premul"];
    if (nb::isinstance<nb::list>(p)) {
      t.premul = nb::cast<std::vector<double>>(p);
    } else {
      t.premul = {nb::cast<double>(p)};
    }
    if (d.contains("premul_residence")) {
      const std::string r = nb::cast<std::string>(d["premul_residence"]);
      if (r != "host" && r != "device") {
        throw nb::value_error("premul_residence must be 'host' or 'device'");
      }
      t.premulDevice = r == "device";
    }
  }
  return t;
}

// Bytes of a task's input and output on one rank.
void TaskBytes(const TaskDesc& t, int n, size_t* in, size_t* out) {
  const size_t b = size_t(t.count) * DataTypeSize(t.dtype);
  switch (t.coll) {
    case Coll::kAllGather:
      *in = b;
      *out = b * n;
      return;
    case Coll::kReduceScatter:
      *in = b * n;
      *out = b;
      return;
    case Coll::kSend:
      *in = b;
      *out = 0;
      return;
    case Coll::kRecv:
      *in = 0;
      *out = b;
      return;
    default:
      *in = b;
      *out = b;
  }
}

struct RunResult {
  std::vector<std::vector<nb::bytes>> outputs;
  double seconds = 0;
};

// inputs[k], the input bytes of the nt tasks of the k-th rank run.
nb::list RankInputs(const nb::list& inputs, size_t k, size_t nt) {
  const nb::list mine = nb::cast<nb::list>(inputs[k]);
  if (mine.size() != nt) {
    throw nb::value_error(
        detail::StrCat("inputs[", k, "] must hold one bytes per task (", nt, "), got ", mine.size())
            .c_str());
  }
  return mine;
}

// The first error of the threads that run ranks.
struct FirstError {
  void Keep(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok()) status = s;
  }
  std::mutex mu;
  Status status;
};

// Per rank run (outBufs[k]: its tasks' output buffers, slots[k]: where they ran), each task's
// output bytes: from its slot's receive buffer, or its output buffer where it has none (a send).
// descOf(k, i) is the TaskDesc of task i of rank k; n, the group's size.
template <typename DescOf>
RunResult Outputs(double seconds, int n, DescOf descOf,
                  const std::vector<std::vector<host::SlotBuffers>>& slots,
                  const std::vector<std::vector<std::vector<char>>>& outBufs) {
  RunResult res;
  res.seconds = seconds;
  res.outputs.resize(outBufs.size());
  for (size_t k = 0; k < outBufs.size(); ++k) {
    for (size_t i = 0; i < outBufs[k].size(); ++i) {
      size_t inB, outB;
      TaskBytes(descOf(k, i), n, &inB, &outB);
      const char* p = static_cast<const char*>(slots[k][i].recv);
      if (p == nullptr) p = outBufs[k][i].data();
      res.outputs[k].push_back(nb::bytes(p, outB));
    }
  }
  return res;
}

RunResult RunPlanThreads(const nb::dict& topology, const nb::list& taskList, const nb::list& inputs,
                         double timeoutS, const std::string& algorithm, const std::string& protocol,
                         bool persistent, bool inPlace, bool forceDirect,
                         const std::vector<int>& skipRanks, int repeat) {
  const TopologyView topo = TopologyFromDict(topology);
  ThrowIfError(ValidateTopology(topo));
  const int n = topo.nRanks;
  if (repeat < 1) throw nb::value_error("repeat must be >= 1");
  // One task list for every rank, or one list per rank (p2p tasks differ between ranks).
  const bool perRank =
      taskList.size() == size_t(n) && taskList.size() > 0 && nb::isinstance<nb::list>(taskList[0]);
  std::vector<std::vector<TestTask>> tasks(n);
  for (int r = 0; r < n; ++r) {
    const nb::list mineTasks = perRank ? nb::cast<nb::list>(taskList[r]) : taskList;
    for (size_t i = 0; i < mineTasks.size(); ++i) {
      tasks[r].push_back(TaskFromDictTest(nb::cast<nb::dict>(mineTasks[i]), i));
    }
  }
  if (inputs.size() != size_t(n)) {
    throw nb::value_error(
        detail::StrCat("inputs must hold one list per rank (", n, "), got ", inputs.size())
            .c_str());
  }

  // Per rank: user ops (PreMulSum scalars), the plan, the buffers.
  std::vector<std::unique_ptr<RedOpTable>> opTables(n);
  std::vector<std::vector<uint64_t>> scalarStore(n);
  std::vector<std::vector<std::vector<char>>> inBufs(n), outBufs(n);
  std::vector<std::vector<host::SlotBuffers>> peers(n);
  std::vector<Plan> plans;
  plans.reserve(n);
  const uint32_t algoMask = ValueOrThrow(ParseAlgoMask(algorithm, "algorithm"));
  const uint32_t protoMask = ValueOrThrow(ParseProtoMask(protocol, "protocol"));
  for (int r = 0; r < n; ++r) {
    const size_t nt = tasks[r].size();
    scalarStore[r].assign(nt, 0);
    peers[r].resize(nt);
    opTables[r] = std::make_unique<RedOpTable>(0x1234);
    PlanRequest req;
    req.topo = topo;
    req.rank = r;
    req.tuning.algoMask = algoMask;
    req.tuning.protoMask = protoMask;
    req.persistent = persistent;
    req.userOps = opTables[r].get();
    for (size_t i = 0; i < nt; ++i) {
      TaskDesc d = tasks[r][i].desc;
      if (!tasks[r][i].premul.empty()) {
        const double v =
            tasks[r][i].premul.size() == 1 ? tasks[r][i].premul[0] : tasks[r][i].premul.at(r);
        scalarStore[r][i] = ScalarBits(v, d.dtype);
        const void* where = &scalarStore[r][i];
        const ScalarResidence res =
            tasks[r][i].premulDevice ? ScalarResidence::kDevice : ScalarResidence::kHostImmediate;
        // A "device" scalar is named by its address (here a host address read at execution).
        const uintptr_t addr = reinterpret_cast<uintptr_t>(where);
        d.op = ValueOrThrow(opTables[r]->CreatePreMulSum(
            tasks[r][i].premulDevice ? reinterpret_cast<const void*>(addr) : where, d.dtype, res));
      }
      req.tasks.push_back(d);
    }
    plans.push_back(ValueOrThrow(MakePlan(req)));
    if (forceDirect) {
      for (TaskPlan& tp : plans.back().tasks) {
        if (tp.kernel >= 0 && tp.coll != Coll::kSend && tp.coll != Coll::kRecv) {
          tp.algo = Algo::kDirect;
          tp.pattern = Pattern::kDirect;
        }
      }
    }

    const nb::list mine = RankInputs(inputs, size_t(r), nt);
    inBufs[r].resize(nt);
    outBufs[r].resize(nt);
    for (size_t i = 0; i < nt; ++i) {
      const TaskDesc& d = tasks[r][i].desc;
      size_t inB, outB;
      TaskBytes(d, n, &inB, &outB);
      nb::bytes b = nb::cast<nb::bytes>(mine[i]);
      if (b.size() != inB) {
        throw nb::value_error(detail::StrCat("inputs[", r, "][", i, "] (", CollName(d.coll),
                                             ") must be ", inB, " bytes, got ", b.size())
                                  .c_str());
      }
      const size_t rowB = size_t(d.count) * DataTypeSize(d.dtype);
      if (inPlace &&
          (d.coll == Coll::kAllReduce || d.coll == Coll::kBroadcast || d.coll == Coll::kReduce ||
           d.coll == Coll::kAllGather || d.coll == Coll::kReduceScatter)) {
        // One buffer: the output holds the input where the collective reads it in place.
        const size_t total = std::max(inB, outB);
        outBufs[r][i].assign(total + 1, 0);
        char* base = outBufs[r][i].data();
        if (d.coll == Coll::kAllGather) {
          std::memcpy(base + r * rowB, b.c_str(), inB);
          peers[r][i].send = base + r * rowB;
          peers[r][i].recv = base;
        } else if (d.coll == Coll::kReduceScatter) {
          std::memcpy(base, b.c_str(), inB);
          peers[r][i].send = base;
          peers[r][i].recv = base + r * rowB;
        } else {
          std::memcpy(base, b.c_str(), inB);
          peers[r][i].send = base;
          peers[r][i].recv = base;
        }
        continue;
      }
      inBufs[r][i].assign(b.c_str(), b.c_str() + inB);
      inBufs[r][i].push_back(0);  // never empty: a valid pointer for zero-byte tasks
      outBufs[r][i].assign(outB + 1, 0);
      peers[r][i].send = inB > 0 || d.coll != Coll::kRecv ? inBufs[r][i].data() : nullptr;
      peers[r][i].recv = d.coll == Coll::kSend ? nullptr : outBufs[r][i].data();
    }
  }

  std::unique_ptr<host::HostTransport> transport = ValueOrThrow(host::MakeHostTransport(topo));
  std::atomic<bool> aborted{false};
  TestBarrier barrier(n, &aborted);
  FirstError firstError;
  double seconds = 0;
  {
    nb::gil_scoped_release release;
    const auto deadlineSpan =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutS));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      if (std::find(skipRanks.begin(), skipRanks.end(), r) != skipRanks.end()) continue;
      threads.emplace_back([&, r]() {
        host::ExecContext ctx;
        ctx.rank = r;
        ctx.nRanks = n;
        ctx.transport = transport.get();
        ctx.peers = &peers;
        ctx.aborted = &aborted;
        ctx.name = "run_plan_threads";
        Status s;
        Clock::time_point t0;
        for (int it = 0; it < repeat && s.ok(); ++it) {
          ctx.deadline = Clock::now() + deadlineSpan;
          ctx.barrier = [&barrier, r, &ctx]() { return barrier.Wait(r, ctx.deadline); };
          if (it == 0 && repeat > 1) s = barrier.Wait(r, ctx.deadline);
          if (it == 0) t0 = Clock::now();
          if (s.ok()) s = host::ExecutePlan(plans[r], ctx);
          if (s.ok() && repeat > 1) s = barrier.Wait(r, ctx.deadline);
        }
        if (s.ok() && r == 0) {
          seconds = std::chrono::duration<double>(Clock::now() - t0).count() / repeat;
        }
        if (!s.ok()) {
          firstError.Keep(s);
          aborted.store(true);
          transport->WakeAll();
          barrier.WakeAll();
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ThrowIfError(firstError.status);
  return Outputs(seconds, n, [&](size_t r, size_t i) { return tasks[r][i].desc; }, peers, outBufs);
}

std::atomic<int64_t> g_processInstance{1 << 30};

// This process's ranks `localRanks` of the group `groupDevices`, through the communicator.
RunResult RunPlanProcess(const std::vector<int64_t>& groupDevices,
                         const std::vector<int>& localRanks, const nb::list& taskList,
                         const nb::list& inputs, double timeoutS, const std::string& algorithm,
                         const std::string& protocol, int64_t callSite, int repeat) {
  if (repeat < 1) throw nb::value_error("repeat must be >= 1");
  const Params params = LoadParams();
  StatusOr<cpu::Communicator*> made = [&]() {
    // Without the interpreter's lock: connecting a group may run the bootstrap (EnsureWorld),
    // which takes it.
    nb::gil_scoped_release release;
    return cpu::World::Get().GetOrCreate(groupDevices, params);
  }();
  cpu::Communicator* comm = ValueOrThrow(std::move(made));
  const int n = comm->nRanks();
  const size_t nl = localRanks.size();
  if (inputs.size() != nl) {
    throw nb::value_error(
        detail::StrCat("inputs must hold one list per local rank (", nl, "), got ", inputs.size())
            .c_str());
  }
  const bool perRank =
      taskList.size() == size_t(n) && taskList.size() > 0 && nb::isinstance<nb::list>(taskList[0]);
  const uint32_t algoMask = ValueOrThrow(ParseAlgoMask(algorithm, "algorithm"));
  const uint32_t protoMask = ValueOrThrow(ParseProtoMask(protocol, "protocol"));
  std::vector<Plan> plans;
  plans.reserve(nl);
  std::vector<comm::CallFingerprint> fps(nl);
  std::vector<std::vector<std::vector<char>>> inBufs(nl), outBufs(nl);
  std::vector<std::vector<host::SlotBuffers>> slots(nl);
  std::vector<std::vector<TaskDesc>> descs(nl);
  for (size_t li = 0; li < nl; ++li) {
    const int r = localRanks[li];
    if (r < 0 || r >= n) throw nb::value_error("local_ranks: rank out of range");
    const nb::list mineTasks = perRank ? nb::cast<nb::list>(taskList[size_t(r)]) : taskList;
    PlanRequest req;
    req.topo = comm->topo();
    req.rank = r;
    req.tuning.algoMask = algoMask;
    req.tuning.protoMask = protoMask;
    req.persistent = true;
    for (size_t i = 0; i < mineTasks.size(); ++i) {
      req.tasks.push_back(TaskFromDictTest(nb::cast<nb::dict>(mineTasks[i]), i).desc);
    }
    descs[li] = req.tasks;
    plans.push_back(ValueOrThrow(MakePlan(req)));
    fps[li] = comm::FingerprintPlan(plans.back(), 0);
    const size_t nt = descs[li].size();
    const nb::list mine = RankInputs(inputs, li, nt);
    inBufs[li].resize(nt);
    outBufs[li].resize(nt);
    slots[li].resize(nt);
    for (size_t i = 0; i < nt; ++i) {
      size_t inB, outB;
      TaskBytes(descs[li][i], n, &inB, &outB);
      nb::bytes b = nb::cast<nb::bytes>(mine[i]);
      if (b.size() != inB) {
        throw nb::value_error(
            detail::StrCat("inputs[", li, "][", i, "] must be ", inB, " bytes, got ", b.size())
                .c_str());
      }
      inBufs[li][i].assign(b.c_str(), b.c_str() + inB);
      inBufs[li][i].push_back(0);
      outBufs[li][i].assign(outB + 1, 0);
      slots[li][i].send = descs[li][i].coll == Coll::kRecv ? nullptr : inBufs[li][i].data();
      slots[li][i].recv = descs[li][i].coll == Coll::kSend ? nullptr : outBufs[li][i].data();
    }
  }

  const int64_t instance = g_processInstance.fetch_add(1);
  FirstError firstError;
  double seconds = 0;
  {
    nb::gil_scoped_release release;
    std::vector<std::thread> threads;
    for (size_t li = 0; li < nl; ++li) {
      threads.emplace_back([&, li]() {
        const int r = localRanks[li];
        Status s;
        Clock::time_point t0 = Clock::now();
        const int total = repeat > 1 ? repeat + 1 : 1;  // one warm-up when timing
        for (int it = 0; it < total && s.ok(); ++it) {
          if (it == 1) t0 = Clock::now();
          cpu::Arrival a;
          a.rank = r;
          a.slots = slots[li];
          a.collFingerprint = fps[li].coll;
          a.what = fps[li].text;
          a.sendHash = fps[li].send;
          a.recvHash = fps[li].recv;
          s = comm->Run(
              cpu::ExecKey{instance, callSite, it}, std::move(a), timeoutS, "run_plan_process",
              [&](const host::ExecContext& ctx) { return host::ExecutePlan(plans[li], ctx); });
        }
        if (s.ok() && li == 0) {
          seconds = std::chrono::duration<double>(Clock::now() - t0).count() / repeat;
        }
        if (!s.ok()) firstError.Keep(s);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ThrowIfError(firstError.status);
  return Outputs(seconds, n, [&](size_t li, size_t i) { return descs[li][i]; }, slots, outBufs);
}

}  // namespace

void BindProxy(nb::module_& m);  // bind_proxy.cc

}  // namespace jax_rccl

NB_MODULE(_jax_rccl_testing, m) {
  using namespace jax_rccl;
  m.doc() =
      "Test-only entry points of jax_rccl: the host executor over threads of this process, and "
      "the communicator driven without JAX. This module holds its own copy of the runtime's "
      "state (world table, communicators), apart from jax_rccl._jax_rccl.";
  // The socket transport's set-up, for this module's own copy of the runtime.
  BindSocketSetup(m, true);
  BindProxy(m);
  m.def(
      "run_plan_process",
      [](nb::object world, const std::vector<int64_t>& group_devices,
         const std::vector<int>& local_ranks, const nb::list& tasks, const nb::list& inputs,
         double timeout_s, const std::string& algorithm, const std::string& protocol,
         int64_t call_site, int repeat) {
        if (!world.is_none()) {
          SetWorld(nb::cast<nb::dict>(world));
        }
        RunResult r = RunPlanProcess(group_devices, local_ranks, tasks, inputs, timeout_s,
                                     algorithm, protocol, call_site, repeat);
        return std::make_tuple(r.outputs, r.seconds);
      },
      nb::arg("world").none(), nb::arg("group_device_ids"), nb::arg("local_ranks"),
      nb::arg("tasks"), nb::arg("inputs"), nb::arg("timeout_s") = 10.0, nb::arg("algorithm") = "",
      nb::arg("protocol") = "", nb::arg("call_site") = 0, nb::arg("repeat") = 1,
      "Runs this process's ranks `local_ranks` of the replica group `group_device_ids` through "
      "the runtime's communicator (after set_world(world) unless world is None): plans `tasks` "
      "(one list, or one list per rank of the group) per local rank, runs each as a thread and "
      "returns (outputs[local index][task] as bytes, seconds per execution on the first local "
      "rank; with repeat > 1 after one warm-up execution). `call_site` keys the first-use check "
      "across processes.");
  m.def(
      "run_plan_threads",
      [](const nb::dict& topology, const nb::list& tasks, const nb::list& inputs, double timeout_s,
         const std::string& algorithm, const std::string& protocol, bool persistent, bool in_place,
         bool force_direct, const std::vector<int>& skip_ranks, int repeat) {
        RunResult r = RunPlanThreads(topology, tasks, inputs, timeout_s, algorithm, protocol,
                                     persistent, in_place, force_direct, skip_ranks, repeat);
        return std::make_tuple(r.outputs, r.seconds);
      },
      nb::arg("topology"), nb::arg("tasks"), nb::arg("inputs"), nb::arg("timeout_s") = 10.0,
      nb::arg("algorithm") = "", nb::arg("protocol") = "", nb::arg("persistent") = true,
      nb::arg("in_place") = false, nb::arg("force_direct") = false,
      nb::arg("skip_ranks") = std::vector<int>{}, nb::arg("repeat") = 1,
      "Plans `tasks` (dicts: coll, count, dtype, op, root, peer, premul, premul_residence) for "
      "every rank of `topology`, runs the ranks as threads through the host executor and returns "
      "(outputs[rank][task] as bytes, seconds per execution measured on rank 0). `inputs[rank]"
      "[task]` are the input bytes (b'' for a recv). Ranks in `skip_ranks` never run.");
}
