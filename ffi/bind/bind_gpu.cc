// Python bindings of the GPU runtime (submodule `gpu` of jax_rccl._jax_rccl, GPU builds only):
// the one-GPU multi-rank harness, device buffers for it, and the floors. Buffers are device
// pointers passed as integers; jax_rccl/harness.py wraps them for tests and benchmarks.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/gpu/comm.h"
#include "ffi/handlers/gpu.h"
#include "ffi/planner/planner.h"
#include "hip/runtime.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

using SlotList = std::vector<std::vector<std::tuple<uintptr_t, uintptr_t>>>;

std::vector<std::vector<gpu::SlotPtrs>> ToSlots(const SlotList& in) {
  std::vector<std::vector<gpu::SlotPtrs>> out(in.size());
  for (size_t r = 0; r < in.size(); ++r) {
    for (const auto& [s, d] : in[r]) {
      gpu::SlotPtrs p{};
      p.send = reinterpret_cast<const void*>(s);
      p.recv = reinterpret_cast<void*>(d);
      out[r].push_back(p);
    }
  }
  return out;
}

}  // namespace

void BindGpu(nb::module_& m) {
  nb::module_ g = m.def_submodule("gpu", "The GPU runtime: one-GPU multi-rank harness and floors");
  g.def("build_info", &gpu::DeviceBuildInfo);
  g.def(
      "has_dtype",
      [](const std::string& dtype) {
        return gpu::DeviceHasDtype(ValueOrThrow(ParseDataType(dtype)));
      },
      nb::arg("dtype"), "Whether the device code reduces over `dtype`.");
  g.def("has_ll128", &gpu::DeviceHasLL128, "Whether this build's device code runs LL128.");
  g.def(
      "alloc",
      [](int64_t bytes) {
        return reinterpret_cast<uintptr_t>(ValueOrThrow(gpu::DeviceAlloc(bytes)));
      },
      nb::arg("nbytes"));
  g.def("free", [](uintptr_t p) { gpu::DeviceFree(reinterpret_cast<void*>(p)); }, nb::arg("ptr"));
  g.def(
      "upload",
      [](uintptr_t dst, nb::bytes data) {
        ThrowIfError(gpu::CopyToDevice(reinterpret_cast<void*>(dst), data.c_str(),
                                       static_cast<int64_t>(data.size())));
      },
      nb::arg("ptr"), nb::arg("data"));
  g.def(
      "download",
      [](uintptr_t src, int64_t bytes) {
        std::string buf(static_cast<size_t>(bytes), '\0');
        ThrowIfError(gpu::CopyToHost(buf.data(), reinterpret_cast<const void*>(src), bytes));
        return nb::bytes(buf.data(), buf.size());
      },
      nb::arg("ptr"), nb::arg("nbytes"));
  g.def(
      "device_capacity",
      []() {
        gpu::DeviceCapacity c = ValueOrThrow(gpu::QueryDeviceCapacity());
        nb::dict d;
        d["sm_count"] = c.smCount;
        d["blocks_per_sm"] = c.blocksPerSm;
        d["mps_active_thread_percent"] = c.mpsActiveThreadPercent;
        d["resident_blocks"] = c.residentBlocks;
        d["max_threads"] = gpu::kMaxLaunchThreads;
        return d;
      },
      "What the current device holds of the collective kernels at once: multiprocessors, blocks "
      "per multiprocessor (at the largest block), MPS active thread percentage, resident blocks.");
  g.attr("TRACE_EVENTS") = gpu::kTraceEvents;  // timeline words per block (Harness.trace)
  g.def(
      "floors",
      [](int64_t copyBytes, int iters) {
        gpu::Floors f = ValueOrThrow(gpu::MeasureFloors(copyBytes, iters));
        nb::dict d;
        d["copy_gbs"] = f.copyGBs;
        d["launch_us"] = f.launchUs;
        d["graph_us"] = f.graphUs;
        d["graph_kernel_us"] = f.graphKernelUs;
        d["graph_reps"] = gpu::kFloorGraphReps;
        return d;
      },
      nb::arg("copy_bytes") = int64_t(1) << 30, nb::arg("iters") = 20,
      "Device-to-device copy bandwidth (GB/s, read + write), an empty launch and an empty graph "
      "replay (us).");

  nb::class_<gpu::Harness>(g, "Harness")
      .def_static(
          "create",
          [](const nb::dict& topology, double timeout) {
            return ValueOrThrow(gpu::Harness::Create(TopologyFromDict(topology), timeout));
          },
          nb::arg("topology"), nb::arg("timeout") = 30.0)
      .def_prop_ro("nranks", &gpu::Harness::nRanks)
      .def(
          "build",
          [](gpu::Harness& h, const nb::list& perRank, const std::string& algo,
             const std::string& proto, int64_t p2pLLThreshold) {
            // The harness's own topology is used; the requests carry tasks and tuning.
            std::vector<std::vector<TaskDesc>> tasks;
            PlanRequest req;
            for (size_t r = 0; r < perRank.size(); ++r) {
              req = MakeRequest(nb::dict(), nb::cast<nb::list>(perRank[r]), 0, algo, proto,
                                nb::none(), nullptr, true, 0, p2pLLThreshold);
              tasks.push_back(req.tasks);
            }
            ThrowIfError(h.Build(tasks, req.tuning, req.params));
          },
          nb::arg("tasks_per_rank"), nb::arg("algorithm") = "", nb::arg("protocol") = "",
          nb::arg("p2p_ll_threshold") = 16384)
      .def(
          "plan_summary",
          [](const gpu::Harness& h, int rank) {
            const Plan& p = h.plan(rank);
            nb::list out;
            for (const TaskPlan& tp : p.tasks) {
              nb::dict d;
              d["coll"] = CollName(tp.coll);
              d["algorithm"] = AlgoName(tp.algo);
              d["protocol"] = ProtoName(tp.proto);
              d["nchannels"] = tp.nChannels;
              d["nthreads"] = tp.nThreads;
              d["count"] = tp.count;
              out.append(d);
            }
            return out;
          },
          nb::arg("rank") = 0)
      .def(
          "launch",
          [](gpu::Harness& h, const SlotList& slots) { ThrowIfError(h.Launch(ToSlots(slots))); },
          nb::arg("slots"), "One launch of every rank; slots[rank][task] = (send, recv) pointers.")
      .def(
          "launch_ranks",
          [](gpu::Harness& h, const SlotList& slots, const std::vector<int>& ranks) {
            ThrowIfError(h.Launch(ToSlots(slots), &ranks));
          },
          nb::arg("slots"), nb::arg("ranks"), "Launches only `ranks` (fault tests).")
      .def("sync",
           [](gpu::Harness& h) {
             nb::gil_scoped_release release;
             Status s = h.Sync();
             nb::gil_scoped_acquire acquire;
             ThrowIfError(s);
           })
      .def(
          "time_launches",
          [](gpu::Harness& h, const SlotList& slots, int warmup, int iters) {
            return ValueOrThrow(h.TimeLaunches(ToSlots(slots), warmup, iters));
          },
          nb::arg("slots"), nb::arg("warmup") = 5, nb::arg("iters") = 20)
      .def(
          "trace",
          [](gpu::Harness& h, const SlotList& slots) {
            std::vector<std::vector<uint64_t>> t = ValueOrThrow(h.Trace(ToSlots(slots)));
            nb::list out;
            for (const std::vector<uint64_t>& r : t) {
              nb::list words;
              for (uint64_t w : r) words.append(w);
              out.append(words);
            }
            return out;
          },
          nb::arg("slots"),
          "One launch of every rank with a timeline: per rank, kTraceEvents words per block "
          "(event << 56 | device ns).")
      .def(
          "time_graph",
          [](gpu::Harness& h, const SlotList& slots, int iters, int reps) {
            return ValueOrThrow(h.TimeGraph(ToSlots(slots), iters, reps));
          },
          nb::arg("slots"), nb::arg("iters") = 20, nb::arg("reps") = 1);

  // The FFI handlers of the GPU platforms (ffi/handlers/gpu.cc), registered by jax_rccl/_ffi.py.
  g.def(
      "ffi_targets",
      []() {
        nb::dict out;
        for (const cpu::FfiTarget& t : gpu::GpuFfiTargets()) {
          nb::dict stages;
          stages["instantiate"] = nb::capsule(t.instantiate);
          stages["execute"] = nb::capsule(t.execute);
          out[t.name] = stages;
        }
        return out;
      },
      "The GPU FFI targets: {name: {'instantiate': capsule, 'execute': capsule}}.");
  g.def(
      "ffi_types",
      []() {
        nb::dict reg;
        reg["type_id"] = nb::capsule(gpu::GpuStateTypeId());
        reg["type_info"] = nb::capsule(gpu::GpuStateTypeInfo());
        nb::dict out;
        out[gpu::kGpuStateTypeName] = reg;
        return out;
      },
      "The GPU state type: {name: {'type_id': capsule, 'type_info': capsule}}.");
  g.def("set_local_devices", &gpu::SetLocalDevices, nb::arg("devices"),
        "The local GPUs as [(device ordinal, global device id)] (from jax.local_devices()).");
  g.def(
      "connection_counters",
      [](const std::vector<int64_t>& devices, int rank) {
        gpu::GpuComm* comm = gpu::FindComm(devices);
        if (comm == nullptr) throw nb::value_error("no GPU communicator for these devices");
        if (rank < 0 || rank >= comm->nRanks()) throw nb::value_error("rank out of range");
        StatusOr<std::vector<std::array<int64_t, 6>>> c = comm->Counters(rank);
        if (!c.ok()) throw std::runtime_error(c.status().ToString());
        return c.value();
      },
      nb::arg("devices"), nb::arg("rank"),
      "A rank's connection counters, from its own region: [(channel, peer, tail, head, send "
      "tail, send head)] (tail/head: the connection peer -> rank; send: rank -> peer).");
  g.def("communicators", &gpu::CommCount, "How many GPU communicators this process holds.");
}

}  // namespace jax_rccl
