// Python view of the CPU runtime: the FFI targets and the state type to register with JAX, the
// runtime's counters and the topology it plans with.
#include <nanobind/nanobind.h>

#include "ffi/bindings.h"
#include "ffi/cpu/comm.h"
#include "ffi/cpu/handlers.h"
#include "ffi/params.h"

namespace nb = nanobind;

namespace jax_rccl {

void BindRuntime(nb::module_& m) {
  m.def(
      "cpu_ffi_targets",
      []() {
        nb::dict out;
        for (const cpu::FfiTarget& t : cpu::CpuFfiTargets()) {
          nb::dict stages;
          stages["instantiate"] = nb::capsule(t.instantiate);
          stages["execute"] = nb::capsule(t.execute);
          out[t.name] = stages;
        }
        return out;
      },
      "The CPU FFI targets: {name: {'instantiate': capsule, 'execute': capsule}}.");
  m.def(
      "cpu_ffi_types",
      []() {
        nb::dict reg;
        reg["type_id"] = nb::capsule(cpu::CpuStateTypeId());
        reg["type_info"] = nb::capsule(cpu::CpuStateTypeInfo());
        nb::dict out;
        out[cpu::kCpuStateTypeName] = reg;
        return out;
      },
      "The CPU state type: {name: {'type_id': capsule, 'type_info': capsule}}.");
  m.def(
      "runtime_stats",
      []() {
        const cpu::RuntimeStats& s = cpu::Stats();
        nb::dict d;
        d["plans_built"] = s.plansBuilt.load();
        d["executions"] = s.executions.load();
        d["instantiations"] = s.instantiations.load();
        d["rendezvous_timeouts"] = s.rendezvousTimeouts.load();
        d["mismatches"] = s.mismatches.load();
        d["errors"] = s.errors.load();
        d["communicators"] = s.communicators.load();
        d["rendezvous_pending"] = s.rendezvousPending.load();
        return d;
      },
      "Counters of the CPU runtime (communicators and rendezvous_pending are gauges).");
  m.def(
      "reset_runtime_stats", []() { cpu::ResetStats(); },
      "Zeroes the runtime counters (not the gauges).");
  m.def(
      "cpu_topology",
      [](int nranks) {
        if (nranks < 1) throw nb::value_error("cpu_topology: nranks must be >= 1");
        const TopologyView t = cpu::CpuTopology(nranks, LoadParams());
        nb::dict d;
        d["nRanks"] = t.nRanks;
        d["nNodes"] = t.nNodes;
        d["arch"] = ArchName(t.arch);
        d["intraLink"] = LinkName(t.intraLink);
        d["interLink"] = LinkName(t.interLink);
        d["bwIntra"] = t.bwIntra;
        d["bwInter"] = t.bwInter;
        d["nChannels"] = t.nChannels;
        d["p2pnChannels"] = t.p2pnChannels;
        d["p2pnChannelsPerPeer"] = t.p2pnChannelsPerPeer;
        nb::list sizes;
        for (int p = 0; p < kNumProtos; ++p) sizes.append(t.buffSizes[p]);
        d["buffSizes"] = sizes;
        d["p2pChunkSize"] = t.p2pChunkSize;
        d["ll128Enabled"] = t.ll128Enabled;
        d["treeDefined"] = t.treeDefined;
        d["pivotA2ANumBiRings"] = t.pivotA2ANumBiRings;
        d["workFifoDepth"] = t.workFifoDepth;
        d["directPeers"] = t.directPeers;
        return d;
      },
      nb::arg("nranks"),
      "The topology the CPU runtime plans with for a group of `nranks` (a TopologyView dict).");
}

}  // namespace jax_rccl
